-- ADOPT of the keys of one multi-resource grant.
--
--   KEYS   the grant's keys
--   ARGV   old token, new token, ttl ms, label
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> {1, "largest fence carried", value field} rotated | {0} nothing
--      written (the value field: lib/value_of.lua's, of the first key)
--
-- ADOPT: every key holds the old token (ARGV[1]): each gets the new token
-- (ARGV[2]) and label (ARGV[4]) with the fence it carries, and the ttl
-- ARGV[3]; {1, the largest fence carried}. Else nothing is written: {0}.
-- A holder's value in the old label is carried into the new one.
--@include guard
--@include ours
--@include fence_of
--@include value_of
local vals, held, best = {}, {}, ''
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if not ours(v, ARGV[1]) then return {0} end
  local f = fence_of(v) or ''
  if #f > #best or (#f == #best and f > best) then best = f end
  vals[i] = f
  held[i] = value_of(v)
end
for i = 1, #KEYS do
  local v = ARGV[2]
  if ARGV[4] ~= '' and vals[i] ~= '' then
    local label = ARGV[4]
    if held[i] ~= '' then label = string.sub(label, 1, -2) .. held[i] .. '}' end
    v = ARGV[2] .. ' ' .. label .. ' ' .. vals[i]
  end
  redis.call('SET', KEYS[i], v, 'PX', ARGV[3])
end
note_ttl(ARGV[3])
return {1, best, held[1]}
