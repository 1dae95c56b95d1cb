-- RELABEL: EXTEND with value=: the holder's value replaced, owner-checked,
-- without giving up the lock.
--
--   KEYS   lock
--   ARGV   token, the new label (with the value), ttl ms
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> 1 ours and relabelled | 0 not ours
--
-- The key keeps its token and fence ("token label fence", daemon/label.h);
-- a key without a fence (written by no redlockd acquisition) keeps its
-- token alone.
--@include guard
--@include ours
--@include fence_of
local v = redis.pcall('GET', KEYS[1])
if not ours(v, ARGV[1]) then return 0 end
local f = fence_of(v)
local nv = ARGV[1]
if f then nv = ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. f end
redis.call('SET', KEYS[1], nv, 'PX', ARGV[3])
note_ttl(ARGV[3])
return 1
