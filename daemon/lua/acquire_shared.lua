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
--@include notlock
--@include shared_put
--@include fences_prune
--@include busy
--@include seen | arg=ARGV[3]
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  if t ~= 'string' then return notlock(KEYS[1], t) end
  return {0, busy(KEYS[1], ARGV[5])}
end
t = redis.call('TYPE', KEYS[3])['ok']
if t ~= 'none' and t ~= 'zset' then return notlock(KEYS[3], t) end
if t == 'zset' then
--@include now
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  prune(KEYS[3])
end
put(KEYS[3], ARGV[1], tonumber(ARGV[2]), f)
--@include grant
