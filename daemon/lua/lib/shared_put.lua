local function put(s, token, ttl, f)
--@include now
  redis.call('ZADD', s, now + ttl, token)
  if redis.call('PTTL', s) < ttl then redis.call('PEXPIRE', s, ttl) end
  local h = s .. '@CONF_FENCES_SUFFIX@'
  if f then redis.call('HSET', h, token, f) end
  if redis.call('PTTL', h) < ttl then redis.call('PEXPIRE', h, ttl) end
end
