-- The grant of a lock, as the ACQUIRE, ACQUIRE_SHARED and ACQUIRE_MULTI
-- scripts and GROUP make it: take_exclusive(lock, shared, a) and
-- take_shared(lock, shared, a) of one resource, take_multi(k, n, a) of the
-- n resources whose lock and shared set are KEYS[k], KEYS[k + 1], ... (all
-- or none), with the request's words at ARGV[a..a+4] (token, ttl ms,
-- largest fence seen, label, wait) and the counter read into c
-- (lib/counter_read.lua). Each answers {1, fence} with
-- the key or member written (fence = max(c, seen) + 1; the caller writes
-- the counter and the longest-ttl record), {0, pttl} of what stands in
-- the way (marked as waited for when wait is '1'), or the error of a key
-- of a foreign type, which is never a vote.
--@include notlock
--@include readers
-- (readers brings kind, which take_shared and take_multi use too)
--@include busy
--@include succ
--@include shared_put
--@include fences_prune
local function fence_for(seen)
  local m = c
  if above(seen, m) then m = seen end
  return succ(m)
end
-- What a granted exclusive key holds: "token label fence" when the holder
-- gave a label (redlockd's JSON naming daemon, session and client; see
-- docs/design.md, "Holder labels"), else just the token. STATUS on any
-- daemon reads it back.
local function value_of(a, f)
  if ARGV[a + 3] and ARGV[a + 3] ~= '' then
    return ARGV[a] .. ' ' .. ARGV[a + 3] .. ' ' .. f
  end
  return ARGV[a]
end
-- Exclusive: not while the shared set (when given) has a live member, then
-- SET NX PX of the value.
local function take_exclusive(lock, shared, a)
  if shared then
    local n, t = readers(shared)
    if not n then return notlock(shared, t) end
    if n > 0 then return {0, busy(shared, ARGV[a + 4])} end
  end
  local f = fence_for(ARGV[a + 2])
  local value = value_of(a, f)
  if not redis.call('SET', lock, value, 'NX', 'PX', ARGV[a + 1]) then
    local t = redis.call('TYPE', lock)['ok']
    if t ~= 'string' and t ~= 'none' then return notlock(lock, t) end
    return {0, busy(lock, ARGV[a + 4])}
  end
  return {1, f}
end
-- Shared: not while the exclusive key exists (whoever set it, redlockd or
-- another Redlock client); the token becomes a member of the set, expired
-- members and their fences dropped first.
local function take_shared(lock, shared, a)
  local t = kind(lock)
  if t ~= 'none' then
    if t ~= 'string' then return notlock(lock, t) end
    return {0, busy(lock, ARGV[a + 4])}
  end
  t = kind(shared)
  if t ~= 'none' and t ~= 'zset' then return notlock(shared, t) end
  if t == 'zset' then
--@include now
    redis.call('ZREMRANGEBYSCORE', shared, '-inf', now)
    prune(shared)
  end
  local f = fence_for(ARGV[a + 2])
  put(shared, ARGV[a], tonumber(ARGV[a + 1]), f)
  return {1, f}
end
-- Several resources, all or none, in one step: no two requests for
-- overlapping sets can each hold a part. The busy answer's PTTL is the
-- longest of the keys that stood in the way.
local function take_multi(k, n, a)
  local held, wait = false, -1
  for i = k, k + 2 * n - 1, 2 do
    local x, s = KEYS[i], KEYS[i + 1]
    local t = kind(x)
    local p = nil
    if t ~= 'none' then
      if t ~= 'string' then return notlock(x, t) end
      p = busy(x, ARGV[a + 4])
    else
      local r, st = readers(s)
      if not r then return notlock(s, st) end
      if r > 0 then p = busy(s, ARGV[a + 4]) end
    end
    if p then
      held = true
      if p > wait then wait = p end
    end
  end
  if held then return {0, wait} end
  local f = fence_for(ARGV[a + 2])
  local value = value_of(a, f)
  for i = k, k + 2 * n - 1, 2 do
    redis.call('SET', KEYS[i], value, 'PX', ARGV[a + 1])
  end
  return {1, f}
end
