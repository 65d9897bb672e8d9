-- RECORD: writes a task's processing record, only while the task is still in the worker's own
-- list. A worker judged dead (stalled) may record after its task was drained and taken by
-- someone else: an unconditional HSET would overwrite the new holder's record with a stale one
-- that nothing ever deletes.
--
-- Returns 1 if it wrote the record, else 0.
local own = KEYS[1]         -- the worker's own in-flight list
local processing = KEYS[2]  -- processing records: task id -> "<list key> <started>"
local raw = ARGV[1]         -- the task's exact bytes in the own list
local task_id = ARGV[2]
local record = ARGV[3]      -- "<list key> <started>"

if redis.call('LPOS', own, raw) then
  redis.call('HSET', processing, task_id, record)
  return 1
end
return 0
