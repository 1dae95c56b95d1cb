-- Owner checks: value v is token t's, with or without a label after it.
local function ours(v, t)
  return type(v) == 'string' and
         (v == t or string.sub(v, 1, #t + 1) == t .. ' ')
end
