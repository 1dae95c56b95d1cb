-- The guard of every script whose answer is a vote (acquire, extend, raise):
-- its last three arguments are the longest-ttl record, the recovery marker
-- and the run_id under which the daemon admitted this node ('' from a node
-- that does not vote: no check, its answer is not counted). A node whose
-- marker no longer names that run lost its data since it was admitted
-- (FLUSHALL, eviction, a failover to an empty replica): it answers LOSTDATA
-- before writing anything, so its vote fails now rather than at the next
-- probe, and the daemon starts its recovery on that answer. note_ttl(t): the
-- record holds the longest ttl granted or renewed on this node while some
-- such lease may live (its own expiry is kept at least t ahead: set to 2t
-- whenever less than t is left, so that it is written once per t rather than
-- at every grant), so that a daemon deciding how long a node that lost its
-- data must wait can read the longest lease any daemon may still hold
-- (docs/design.md, "Restarted nodes").
--@include guard_fns
local lost = lostdata()
if lost then return lost end
