-- release(k, t, channel, id): 1 when k was ours and is gone, else 0. A key
-- of another type (a shared lock's set) is handled as such: the token's
-- member is removed. The release is announced on channel ("k id" for a key,
-- "k" for a set once it has no live member left: only exclusive waiters wait
-- for that) when a waiter marked k (lib/busy.lua).
--@include ours
local function release(k, t, channel, id)
  local function announce(msg)
    if redis.call('DEL', k .. '@CONF_WAITING_SUFFIX@') == 1 then
      redis.call('PUBLISH', channel, msg)
    end
  end
  local v = redis.pcall('GET', k)
  if type(v) == 'table' and v.err then
    local s = redis.call('ZSCORE', k, t)
    if not s then return 0 end
    redis.call('ZREM', k, t)
    local h = k .. '@CONF_FENCES_SUFFIX@'
    redis.call('HDEL', h, t)
--@include now
    redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
    if redis.call('EXISTS', k) == 0 then
      redis.call('DEL', h)
      announce(k)
    end
    if tonumber(s) <= now then return 0 end
    return 1
  end
  if ours(v, t) then
    if redis.call('DEL', k, k .. '@CONF_WAITING_SUFFIX@') == 2 then
      redis.call('PUBLISH', channel, k .. ' ' .. id)
    end
    return 1
  end
  return 0
end
