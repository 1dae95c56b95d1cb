-- extend(k, t, ttl): 1 when k is ours and now lasts ttl ms more, else 0. On
-- a shared lock's set only a live member is ours to extend (one past its
-- expiry may already have let a writer in).
--@include shared_put
--@include ours
local longest = 0
local function extend(k, t, ttl)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' and v.err then
    local s = redis.call('ZSCORE', k, t)
    if not s then return 0 end
--@include now
    if tonumber(s) <= now then
      redis.call('ZREM', k, t)
      redis.call('HDEL', k .. '@CONF_FENCES_SUFFIX@', t)
      return 0
    end
    put(k, t, tonumber(ttl))
  elseif ours(v, t) then
    redis.call('PEXPIRE', k, ttl)
  else
    return 0
  end
  if tonumber(ttl) > longest then longest = tonumber(ttl) end
  return 1
end
