-- RELEASE: an owner-checked delete, announced if someone waits.
--
--   KEYS   lock or shared holders' set
--   ARGV   token, release channel, this daemon's instance id (it publishes "key id")
--   -> 1 ours and deleted | 0
--
--@include release
return release(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
