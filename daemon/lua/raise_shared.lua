-- RAISE_SHARED: RAISE_HELD for a shared hold.
--
--   KEYS   shared holders' set, fence counter
--   ARGV   token, value to raise to
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> {1, "counter"} | {0, "counter"}
--
-- RAISE_HELD for a shared hold: only while our member is live.
--@include guard
--@include counter | k=2
--@include now
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) <= now then return {0, c} end
if above(ARGV[2], c) then
  redis.call('SET', fk, ARGV[2])
  c = ARGV[2]
end
-- The member's fence too (ADOPT reads it), as RAISE_HELD's.
local h = KEYS[1] .. '@CONF_FENCES_SUFFIX@'
local mf = redis.call('HGET', h, ARGV[1])
if mf and above(ARGV[2], mf) then
  redis.call('HSET', h, ARGV[1], ARGV[2])
end
return {1, c}
