-- The guard's parts (lib/guard.lua), for a script that answers for several
-- requests (group.lua): lostdata() is nil, or the LOSTDATA error
-- of a node whose recovery marker no longer names the run it was admitted
-- under; note_ttl(t) keeps the longest-ttl record.
local ttl_key = ARGV[#ARGV - 2]
local admitted = ARGV[#ARGV]
local function lostdata()
  if admitted ~= '' and redis.call('GET', ARGV[#ARGV - 1]) ~= admitted then
    return redis.error_reply('LOSTDATA ' .. ARGV[#ARGV - 1] .. ' does not ' ..
      'name run ' .. admitted .. ': the node lost its data since it was ' ..
      'admitted')
  end
  return nil
end
local function note_ttl(t)
  t = tonumber(t)
  local v = tonumber(redis.call('GET', ttl_key) or '0') or 0
  if v < t then
    redis.call('SET', ttl_key, t, 'PX', 2 * t)
  elseif redis.call('PTTL', ttl_key) < t then
    redis.call('PEXPIRE', ttl_key, 2 * t)
  end
end
