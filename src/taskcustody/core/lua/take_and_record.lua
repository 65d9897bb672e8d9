-- TAKE_AND_RECORD: a take that never blocks. The worker's list is registered, the task moves from
-- the source's take end into it and its processing record is written, in one atomic step, so no
-- stall can come between them and no guard is needed: the task is surely ours. A prefetching
-- worker sends several of these in one round trip while the queue is busy. With the suspects
-- list as the source it is the take of a suspect (Worker.take_suspect; first in, first out:
-- recovery pushes suspects on the left). An envelope with no usable id is moved without a
-- record; the worker dead-letters it, and the id returned here (not the worker's own parse)
-- tells its release which record to delete.
--
-- Returns {task, id recorded ('' if none)}, or false when the source is empty.
local source = KEYS[1]      -- the queue, or the suspects list (the take of a suspect)
local own = KEYS[2]         -- the worker's own in-flight list
local processing = KEYS[3]  -- processing records: task id -> "<list key> <started>"
local registry = KEYS[4]    -- the registry of in-flight lists
local record = ARGV[1]      -- the task's processing record
local now = ARGV[2]         -- the list's registration score

redis.call('ZADD', registry, now, own)
local raw = redis.call('LMOVE', source, own, 'RIGHT', 'LEFT')
if not raw then return false end
local ok, task = pcall(cjson.decode, raw)
if ok and type(task) == 'table' and type(task['id']) == 'string' and task['id'] ~= '' then
  redis.call('HSET', processing, task['id'], record)
  return {raw, task['id']}
end
return {raw, ''}
