-- ACQUIRE_SHARED: a shared hold of one resource.
--
--   KEYS   lock, fence counter, shared holders' set
--   ARGV   token, ttl ms, largest fence seen, label (unused), wait '1'|'0'
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> {1, "fence"} | {0, pttl} | error
--
-- A shared hold: not while the exclusive key exists (whoever set it,
-- redlockd or another Redlock client).
--@include guard
--@include counter | k=2
--@include take
local r = take_shared(KEYS[1], KEYS[3], 1)
if r[1] == 1 then
  redis.call('SET', fk, r[2])
  note_ttl(ARGV[2])
end
return r
