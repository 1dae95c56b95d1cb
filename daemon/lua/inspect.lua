-- INSPECT: what STATUS shows of one resource.
--
--   KEYS   lock, shared holders' set
--   ARGV   slot key prefix, slots to look at
--   -> {pttl, live shared holders, "0110..." slots present, lock's value or '',
--       the first present slot's value or ''}
--
-- STATUS: the exclusive key's PTTL, the live shared holders, for each of K
-- semaphore slots (keys ARGV[1] .. i, which are not in KEYS: there can be up
-- to locks.max_limit of them) '1' if it exists, and the exclusive key's
-- value ('' when none). A watcher that does not know a semaphore's size
-- reads it from the label of a slot found (daemon/label.h).
--@include now
local n = 0
if redis.call('TYPE', KEYS[2])['ok'] == 'zset' then
  n = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
end
local bits, slot = {}, ''
for i = 0, tonumber(ARGV[2]) - 1 do
  local k = ARGV[1] .. i
  if redis.call('EXISTS', k) == 1 then
    bits[#bits + 1] = '1'
    if slot == '' then
      slot = redis.pcall('GET', k)
      if type(slot) ~= 'string' then slot = '' end
    end
  else
    bits[#bits + 1] = '0'
  end
end
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then v = '' end
return {redis.call('PTTL', KEYS[1]), n, table.concat(bits), v, slot}
