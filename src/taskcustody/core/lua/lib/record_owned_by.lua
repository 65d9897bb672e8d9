-- record_owned_by: whether task `task_id`'s processing record names the in-flight list
-- `list_key`. Records are stored as "<list key> <started>", and list keys never contain spaces,
-- so one string comparison tells whose record it is.
local function record_owned_by(processing, task_id, list_key)
  local rec = redis.call('HGET', processing, task_id)
  return rec and string.sub(rec, 1, #list_key + 1) == list_key .. ' '
end
