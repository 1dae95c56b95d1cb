-- What a granted exclusive key holds: "token label fence" when the holder
-- gave a label (ARGV[4], redlockd's JSON naming daemon, session and client;
-- see docs/design.md, "Holder labels"), else just the token. STATUS on any
-- daemon reads it back.
local value = ARGV[1]
if ARGV[4] and ARGV[4] ~= '' then
  value = ARGV[1] .. ' ' .. ARGV[4] .. ' ' .. f
end
