-- m = max(c, seen), and f = m + 1, the fence a grant gets (seen is ARGV[3]
-- in the acquire scripts). The successor is taken on the decimal string
-- (Lua's doubles are exact only to 2^53).
local m = c
if above(@arg@, m) then m = @arg@ end
local i = #m
while i > 0 and string.byte(m, i) == 57 do i = i - 1 end
local f
if i == 0 then f = '1' .. string.rep('0', #m)
else f = string.sub(m, 1, i - 1) .. string.char(string.byte(m, i) + 1)
         .. string.rep('0', #m - i) end
