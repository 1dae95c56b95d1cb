-- UNDO: a failed acquisition's partial key, not announced.
--
--   KEYS   lock
--   ARGV   token
--   -> 1 deleted | 0
--
--@include ours
if ours(redis.call('GET', KEYS[1]), ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
