-- RAISE: the fence repair of a restarted node (it holds no key).
--
--   KEYS   fence counter
--   ARGV   value
--   -> 1 (the counter is at least value)
--
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
if c < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
