-- ACQUIRE: an exclusive lock of one resource.
--
--   KEYS   lock, fence counter[, the resource's shared holders' set]
--   ARGV   token, ttl ms, largest fence seen, holder label ('' for none), wait '1'|'0'
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> {1, "fence"} granted | {0, pttl of what stood in the way} | error
--
-- With the key taken, the counter becomes max(c, seen) + 1 in the same
-- script: the fence is written while the key is ours. With KEYS[3], the
-- resource's shared holders' set, the key is not taken while that has a live
-- member.
--@include guard
--@include counter | k=2
--@include take
local r = take_exclusive(KEYS[1], KEYS[3], 1)
if r[1] == 1 then
  redis.call('SET', fk, r[2])
  note_ttl(ARGV[2])
end
return r
