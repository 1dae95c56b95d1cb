-- busy(k, wait): the pttl of what stands in the way at k; with wait '1' the
-- key is marked as waited for, so that its release is announced.
local function busy(k, wait)
  local p = redis.call('PTTL', k)
  if wait == '1' then
    local w = p
    if w < 0 then w = 0 end
    redis.call('SET', k .. '@CONF_WAITING_SUFFIX@', '1', 'PX', w + @SCRIPT_WAIT_MARK_MS@)
  end
  return p
end
