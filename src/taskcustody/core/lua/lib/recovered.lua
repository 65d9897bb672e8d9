-- recovered: counts one recovery of a task from a dead holder's list, and says whether it is a
-- poison pill (a task that kills the process that runs it). Every recovery counts the task, in
-- the step that recovers it, in the hash of recovery counts (field <task id>: count; field
-- <task id>:from: the holders that died with it). Past the limit the same step dead-letters the
-- task instead of requeueing it. A commit (or a dead letter) deletes both fields.
local function b64(data)
  local alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
  return ((data:gsub('.', function(x)
    local r, b = '', x:byte()
    for i = 8, 1, -1 do r = r .. (b % 2 ^ i - b % 2 ^ (i - 1) > 0 and '1' or '0') end
    return r
  end) .. '0000'):gsub('%d%d%d?%d?%d?%d?', function(x)
    if #x < 6 then return '' end
    local c = 0
    for i = 1, 6 do c = c + (x:sub(i, i) == '1' and 2 ^ (6 - i) or 0) end
    return alphabet:sub(c + 1, c + 1)
  end) .. ({'', '==', '='})[#data % 3 + 1])
end

-- Counts one recovery of task `id` (raw envelope `raw`) from the list of holder `holder`.
-- Returns nil to requeue it, or the dead letter to push instead (a poison pill).
local function recovered(counts, id, raw, holder, limit, now)
  if limit == '' or not id then return nil end
  local n = redis.call('HINCRBY', counts, id, 1)
  local from = redis.call('HGET', counts, id .. ':from')
  from = (from and (from .. ',') or '') .. holder
  if n <= tonumber(limit) then
    redis.call('HSET', counts, id .. ':from', from)
    return nil
  end
  redis.call('HDEL', counts, id, id .. ':from')
  return cjson.encode({raw = b64(raw), task_id = id, at = tonumber(now), poison = true,
                       recoveries = n, holders = from,
                       error = 'poison pill: recovered ' .. n .. ' times from holders that died'})
end
