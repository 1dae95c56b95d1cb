-- The fence scripts start alike: read the counter (KEYS[k], the fence key
-- fk) into c, and refuse, before any write, a counter that is not a decimal
-- below 10^18 (lib/counter_read.lua).
--@include counter_read
local fk = KEYS[@k@]
local c, bad = counter_read(fk)
if not c then return bad end
