-- value_of(v): the holder's value field of the label in a key's value v,
-- as it is written there (',"value":"..."', the label's last field on an
-- exclusive key: daemon/label.h), or '' when there is none.
local function value_of(v)
  if type(v) ~= 'string' then return '' end
  local i = string.find(v, ',"value":"', 1, true)
  if not i then return '' end
  local j = string.find(v, '"} %d+$', i + 10)
  if not j then return '' end
  return string.sub(v, i, j)
end
