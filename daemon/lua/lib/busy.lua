local function busy(k)
  local p = redis.call('PTTL', k)
  if ARGV[5] == '1' then
    local w = p
    if w < 0 then w = 0 end
    redis.call('SET', k .. '@CONF_WAITING_SUFFIX@', '1', 'PX', w + @POOL_WAIT_MARK_MS@)
  end
  return p
end
