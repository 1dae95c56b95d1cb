-- Fences of members that expired without a release (their holder's daemon
-- died) are dropped once they outnumber the live members: the hash stays
-- within twice the set, at an amortised constant cost.
local function prune(s)
  local h = s .. '@CONF_FENCES_SUFFIX@'
  if redis.call('HLEN', h) <= 2 * redis.call('ZCARD', s) + 16 then
    return
  end
  for _, m in ipairs(redis.call('HKEYS', h)) do
    if not redis.call('ZSCORE', s, m) then redis.call('HDEL', h, m) end
  end
end
