-- FORCE: FORCEUNLOCK, whoever holds the resource.
--
--   KEYS   lock, shared holders' set
--   ARGV   slot key prefix, slots to delete, release channel
--   -> number of keys deleted
--
-- FORCEUNLOCK: every key of the resource, whoever holds it, and the release
-- announced (a slot's too, so semaphore waiters wake).
local n = redis.call('DEL', KEYS[1], KEYS[2])
redis.call('DEL', KEYS[2] .. '@CONF_FENCES_SUFFIX@')
local first = nil
for i = 0, tonumber(ARGV[2]) - 1 do
  local k = ARGV[1] .. i
  if redis.call('DEL', k) == 1 then
    n = n + 1
    first = first or k
  end
end
redis.call('PUBLISH', ARGV[3], KEYS[1])
if first then redis.call('PUBLISH', ARGV[3], first) end
return n
