-- RAISE_HELD: the second round of a grant whose nodes' counters differ.
--
--   KEYS   lock, fence counter[, the grant's other locks]
--   ARGV   token, value to raise to
--   ... and, last, the guard's three words (lib/guard.lua): the
--   longest-ttl record's key, the recovery marker's key, the run_id the
--   node was admitted under ('' for no check): LOSTDATA error otherwise.
--   -> {1, "counter"} ours (raised) | {0, "counter"} not ours
--
-- Only while the key holds our token: a raise where we hold no key proves
-- nothing about the next holder (docs/design.md, "Fences"). KEYS[3] and on:
-- the other keys of a grant of several resources, which must all hold it
-- too.
--@include guard
--@include counter | k=2
--@include ours
--@include fence_of
for i = 1, #KEYS do
  if i ~= 2 and not ours(redis.call('GET', KEYS[i]), ARGV[1]) then
    return {0, c}
  end
end
if above(ARGV[2], c) then
  redis.call('SET', fk, ARGV[2])
  c = ARGV[2]
end
-- The values say the grant's fence too (STATUS, ADOPT read it): the raised
-- one, the key's ttl kept.
for i = 1, #KEYS do
  if i ~= 2 then
    local v = redis.call('GET', KEYS[i])
    local f = fence_of(v)
    if f and above(ARGV[2], f) then
      redis.call('SET', KEYS[i], string.sub(v, 1, #v - #f) .. ARGV[2],
                 'KEEPTTL')
    end
  end
end
return {1, c}
