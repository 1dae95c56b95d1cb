-- The body of a batch script: fn(args) for each key i, each in its own pcall
-- so that one key's error (a key of a foreign type, OOM) is that key's
-- answer alone, not the batch's. Writes before an error stay, as they would
-- for a script of its own.
local out = {}
for i = 1, #KEYS do
  local ok, r = pcall(@fn@, @args@)
  if ok then out[i] = r else
    out[i] = redis.error_reply(type(r) == 'table' and r.err or tostring(r))
  end
end
