-- ADOPT_ONE: ADOPT of one resource, any kind of lease.
--
--   KEYS   lock, shared holders' set
--   ARGV   old token, new token, ttl ms, label, slot key prefix, slots to look at
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> {1, "fence", kind[, "slot", "limit" | value field]} | {0}
--
-- ADOPT of one resource, whatever kind of lease the token holds: the
-- exclusive key, else a live member of the shared set, else one of ARGV[6]
-- semaphore slots (keys ARGV[5] .. i, not in KEYS: up to locks.max_limit of
-- them, read 128 at a time). The lease gets the new token ARGV[2] and the
-- ttl ARGV[3], keeps its fence; a key's label becomes ARGV[4] (a slot's
-- keeps its "limit"). {1, fence, kind[, slot, limit]}, kind "exclusive",
-- "shared" or "slot" ('' for a fence or limit not stored), or {0} with
-- nothing written. An exclusive key's holder value is carried into its new
-- label, and returned (lib/value_of.lua's field) after its kind.
--@include guard
--@include ours
--@include fence_of
--@include value_of
--@include shared_put
local old, new, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local function rotate(k, v, label)
  local f = fence_of(v) or ''
  local nv = new
  if label ~= '' and f ~= '' then
    nv = new .. ' ' .. label .. ' ' .. f
  end
  redis.call('SET', k, nv, 'PX', ttl)
  note_ttl(ttl)
  return f
end
local v = redis.pcall('GET', KEYS[1])
if ours(v, old) then
  local label, held = ARGV[4], value_of(v)
  if held ~= '' and string.sub(label, -1) == '}' then
    label = string.sub(label, 1, -2) .. held .. '}'
  end
  return {1, rotate(KEYS[1], v, label), 'exclusive', held}
end
if redis.call('TYPE', KEYS[2])['ok'] == 'zset' then
  local s = redis.call('ZSCORE', KEYS[2], old)
--@include now
  if s and tonumber(s) > now then
    local h = KEYS[2] .. '@CONF_FENCES_SUFFIX@'
    local f = redis.pcall('HGET', h, old)
    if type(f) ~= 'string' then f = '' end
    redis.call('ZREM', KEYS[2], old)
    redis.pcall('HDEL', h, old)
    put(KEYS[2], new, ttl, f ~= '' and f or nil)
    note_ttl(ttl)
    return {1, f, 'shared'}
  end
end
local n = tonumber(ARGV[6])
for i = 0, n - 1, 128 do
  local ks = {}
  for j = i, math.min(i + 127, n - 1) do ks[#ks + 1] = ARGV[5] .. j end
  local vs = redis.call('MGET', unpack(ks))
  for j = 1, #ks do
    if ours(vs[j], old) then
      -- A slot's label ends with its semaphore's size (daemon/label.h):
      -- the one pattern that reads a label here, anchored at the fence.
      local label, k = ARGV[4], string.match(vs[j], ',"limit":(%d+)} %d+$')
      if k and string.sub(label, -1) == '}' then
        label = string.sub(label, 1, -2) .. ',"limit":' .. k .. '}'
      end
      return {1, rotate(ks[j], vs[j], label), 'slot', tostring(i + j - 1),
              k or ''}
    end
  end
end
return {0}
