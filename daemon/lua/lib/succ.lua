-- succ(m): the decimal string m plus one, taken on the string (Lua's
-- doubles are exact only to 2^53).
local function succ(m)
  local i = #m
  while i > 0 and string.byte(m, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #m) end
  return string.sub(m, 1, i - 1) .. string.char(string.byte(m, i) + 1)
         .. string.rep('0', #m - i)
end
