-- m = max(c, seen), and f = m + 1, the fence a grant gets (seen is ARGV[3]
-- in the acquire scripts).
--@include succ
local m = c
if above(@arg@, m) then m = @arg@ end
local f = succ(m)
