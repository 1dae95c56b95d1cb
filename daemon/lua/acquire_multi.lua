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
--@include notlock
--@include readers
--@include busy
--@include seen | arg=ARGV[3]
--@include value
local held, wait = false, -1
for i = 2, #KEYS, 2 do
  local x, s = KEYS[i], KEYS[i + 1]
  local t = redis.call('TYPE', x)['ok']
  local p = nil
  if t ~= 'none' then
    if t ~= 'string' then return notlock(x, t) end
    p = busy(x, ARGV[5])
  else
    local n, st = readers(s)
    if not n then return notlock(s, st) end
    if n > 0 then p = busy(s, ARGV[5]) end
  end
  if p then
    held = true
    if p > wait then wait = p end
  end
end
if held then return {0, wait} end
for i = 2, #KEYS, 2 do
  redis.call('SET', KEYS[i], value, 'PX', ARGV[2])
end
--@include grant
