-- EXTEND_MANY: renewals due together, each key on its own.
--
--   KEYS   lock or shared set, per lease
--   ARGV   per key: token, ttl ms
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> {1|0|error, ...} one per key (an error fails that key only)
--
-- Renewals due together: key i with token ARGV[2i-1] and ttl ARGV[2i], each
-- owner-checked on its own.
--@include guard
--@include extend
--@include each | fn=extend | args=KEYS[i], ARGV[2 * i - 1], ARGV[2 * i]
if longest > 0 then note_ttl(longest) end
return out
