-- ACQUIRE_MULTI: several resources, all or none.
--
--   KEYS   fence counter, then per resource: lock, shared holders' set
--   ARGV   token, ttl ms, largest fence seen, label, wait '1'|'0'
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> {1, "fence"} | {0, longest pttl in the way} | error
--
-- All the keys or none, in one step: no two requests for overlapping sets
-- can each hold a part. The busy answer's PTTL is the longest of the keys
-- that stood in the way.
--@include guard
--@include counter | k=1
--@include take
local r = take_multi(2, (#KEYS - 1) / 2, 1)
if r[1] == 1 then
  redis.call('SET', fk, r[2])
  note_ttl(ARGV[2])
end
return r
