-- A key of the wrong type is no lock of ours: an error (a failed vote),
-- never a busy vote or a grant.
local function notlock(k, t)
  return redis.error_reply('WRONGTYPE ' .. k .. ' holds a ' .. t ..
                           ', not a lock')
end
