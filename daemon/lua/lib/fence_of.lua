-- The fence a labelled value carries ("token label fence"), or nil.
local function fence_of(v)
  return string.match(v, '^%x+ %S+ (%d+)$')
end
