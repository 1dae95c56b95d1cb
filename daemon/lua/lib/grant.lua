-- The grant: the counter becomes f, written in the same script as the grant,
-- so while the key is ours (docs/design.md, "Fences").
redis.call('SET', fk, f)
note_ttl(ARGV[2])
return {1, f}
