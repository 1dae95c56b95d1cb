-- GROUP: the requests of one loop turn to one connection, in one call
-- (pool.c, "Group commit"): each answered exactly as its own script
-- (ACQUIRE, ACQUIRE_SHARED, ACQUIRE_MULTI, RELEASE, EXTEND) would answer
-- it, run in the order given.
--
--   KEYS   fence counter, then per request: 'a' lock, shared holders' set;
--          'b' lock (an ACQUIRE without the set); 's' lock, shared holders'
--          set (ACQUIRE_SHARED); 'm' per resource: lock, shared holders'
--          set (ACQUIRE_MULTI); 'r' lock; 'e' lock
--   ARGV   the requests' kinds (one letter each), release channel, instance
--          id, then per request: 'a'/'b'/'s' token, ttl ms, largest fence
--          seen, label, wait; 'm' the number of resources, then the same
--          five; 'r' token; 'e' token, ttl ms
--   ... and, last, the guard's three words (lib/guard.lua)
--   -> {answer, ...} one per request: what its own script answers, or an
--      error (that request's alone)
--
-- What runs once for the group: the guard's marker check, the counter's
-- read and write, the longest-ttl record. An error there (a marker or
-- record key of a foreign type, or OOM) is the whole call's, and so every
-- request's, releases included: a failed answer, as a release that cannot
-- reach a node is, and owed to it again (node.c). A node that lost its
-- data answers LOSTDATA to the acquisitions and renewals and still runs
-- the releases, as separate calls would. Fences rise through the group
-- as through separate calls: each grant's is max(counter so far, its
-- seen) + 1.
--@include guard_fns
--@include counter_read
--@include release
--@include extend
local fk = KEYS[1]
local c, bad
--@include take
-- An acquisition (take_exclusive, take_shared or take_multi, given x and
-- y) of the request whose words start at ARGV[a]: the counter is read at
-- the first, and carried from grant to grant, where it meets the same
-- limit as when read (a grant that takes it to 10^18 is the last). The
-- counter read is checked whole (counter_read); what a grant carries is
-- the successor of a decimal (that counter, or a seen fence the daemon
-- formats from an integer), so only its length is checked again: the
-- pattern match at every grant cost about 3 % of the call's time per
-- request.
local function acquire(take, x, y, a)
  if not c then
    c, bad = counter_read(fk)
    if not c then return bad end
  end
  if #c > 18 then return counter_bad(fk) end
  local r = take(x, y, a)
  if r[1] == 1 then
    c = r[2]
    local ttl = tonumber(ARGV[a + 1])
    if ttl > longest then longest = ttl end
  end
  return r
end
local ops = ARGV[1]
local lost = nil
if string.find(ops, '[absme]') then lost = lostdata() end
local out, granted, k, a = {}, false, 2, 4
for i = 1, #ops do
  local op = string.sub(ops, i, i)
  -- This request's keys and words.
  local nk, na = 1, 5
  if op == 'a' or op == 's' then nk = 2
  elseif op == 'r' then na = 1
  elseif op == 'e' then na = 2
  elseif op == 'm' then nk, na = 2 * tonumber(ARGV[a]), 6 end
  local ok, r
  if op == 'r' then
    ok, r = pcall(release, KEYS[k], ARGV[a], ARGV[2], ARGV[3])
  elseif lost then
    ok, r = true, lost
  elseif op == 'e' then
    ok, r = pcall(extend, KEYS[k], ARGV[a], ARGV[a + 1])
  elseif op == 'm' then
    ok, r = pcall(acquire, take_multi, k, nk / 2, a + 1)
  elseif op == 's' then
    ok, r = pcall(acquire, take_shared, KEYS[k], KEYS[k + 1], a)
  else
    ok, r = pcall(acquire, take_exclusive, KEYS[k], nk == 2 and KEYS[k + 1]
                  or nil, a)
  end
  if ok and op ~= 'r' and op ~= 'e' and r[1] == 1 then granted = true end
  if ok then out[i] = r else
    out[i] = redis.error_reply(type(r) == 'table' and r.err or tostring(r))
  end
  k, a = k + nk, a + na
end
if granted then redis.call('SET', fk, c) end
if longest > 0 then note_ttl(longest) end
return out
