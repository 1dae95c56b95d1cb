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
--@include notlock
--@include readers
--@include busy
--@include seen | arg=ARGV[3]
--@include value
if KEYS[3] then
  local n, t = readers(KEYS[3])
  if not n then return notlock(KEYS[3], t) end
  if n > 0 then return {0, busy(KEYS[3], ARGV[5])} end
end
if not redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TYPE', KEYS[1])['ok']
  if t ~= 'string' and t ~= 'none' then return notlock(KEYS[1], t) end
  return {0, busy(KEYS[1], ARGV[5])}
end
--@include grant
