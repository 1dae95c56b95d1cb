-- EXTEND: renew one lease, owner-checked.
--
--   KEYS   lock or shared holders' set
--   ARGV   token, ttl ms
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> 1 ours and renewed | 0 not ours
--
--@include guard
--@include extend
local r = extend(KEYS[1], ARGV[1], ARGV[2])
if r == 1 then note_ttl(longest) end
return r
