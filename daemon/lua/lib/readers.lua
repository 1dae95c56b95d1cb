-- The shared holders of a set s still alive by the node's clock: their count
-- (expired members are dropped first), or nil and the type of a key that is
-- no set.
--@include kind
local function readers(s)
  local t = kind(s)
  if t == 'none' then return 0 end
  if t ~= 'zset' then return nil, t end
--@include now
  redis.call('ZREMRANGEBYSCORE', s, '-inf', now)
  return redis.call('ZCARD', s)
end
