-- counter_read(fk): the fence counter at key fk as a decimal string ('0'
-- when missing), or nil and an error for a counter that is not a decimal
-- below 10^18 (its successor then stays far from overflow). Counters are
-- compared as strings, by length and then byte by byte (above): Lua numbers
-- are doubles, exact only up to 2^53, so no counter is ever turned into one.
local function above(a, b)
  if #a ~= #b then return #a > #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return false
end
-- counter_bad(fk): that refusal (GROUP also gives it when the counter it
-- carries from grant to grant reaches 19 digits).
local function counter_bad(fk)
  return redis.error_reply('ERR fence counter ' .. fk ..
                           ' is not a decimal below 10^18')
end
local function counter_read(fk)
  local c = redis.call('GET', fk) or '0'
  if c ~= '0' and not (#c <= 18 and string.find(c, '^[1-9][0-9]*$')) then
    return nil, counter_bad(fk)
  end
  return c
end
