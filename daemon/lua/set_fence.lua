-- SET_FENCE: a late holder's keys carry the fence the grant got.
--
--   KEYS   the grant's locks, or the shared holders' set of a shared grant
--   ARGV   token, fence
--   -> number of keys rewritten
--
-- A node that answered a grant after a quorum had decided it
-- (redlock_op.c, op_align) may have given it a larger fence from its own
-- counter (which stays: counters never go down). Where a key still holds
-- the token, the fence its value carries (for a shared hold: its field in
-- the set's fences hash) becomes the grant's, ttl kept, so that STATUS
-- and ADOPT read the grant's fence on that node too.
--@include ours
--@include fence_of
local n = 0
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) == 'table' and v.err then
    local h = KEYS[i] .. '@CONF_FENCES_SUFFIX@'
    local f = redis.call('HGET', h, ARGV[1])
    if f and f ~= ARGV[2] then
      redis.call('HSET', h, ARGV[1], ARGV[2])
      n = n + 1
    end
  elseif ours(v, ARGV[1]) then
    local f = fence_of(v)
    if f and f ~= ARGV[2] then
      redis.call('SET', KEYS[i], string.sub(v, 1, #v - #f) .. ARGV[2],
                 'KEEPTTL')
      n = n + 1
    end
  end
end
return n
