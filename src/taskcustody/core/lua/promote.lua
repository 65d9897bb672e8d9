-- PROMOTE: moves every due member of the scheduled set (score <= now, at most a batch, earliest
-- first) to the queue's far end (LPUSH: behind the queued tasks, as an immediate retry), or to
-- the suspects list if its task has a recovery count (it still runs alone). The ZREM decides: a
-- member is pushed only by the step that removed it, so two promoters never move one member
-- twice, and a task is never in both places nor in neither.
--
-- Returns the number moved.
local scheduled = KEYS[1]      -- delayed retries, scored by their due time
local queue = KEYS[2]
local suspects = KEYS[3]
local recoveries = KEYS[4]     -- recovery counts (lib/recovered.lua)
local now = ARGV[1]
local batch = ARGV[2]          -- at most this many per call

local due = redis.call('ZRANGEBYSCORE', scheduled, '-inf', now, 'LIMIT', 0, batch)
local moved = 0
for _, raw in ipairs(due) do
  if redis.call('ZREM', scheduled, raw) == 1 then
    local target = queue
    local ok, task = pcall(cjson.decode, raw)
    if ok and type(task) == 'table' and type(task['id']) == 'string'
        and redis.call('HEXISTS', recoveries, task['id']) == 1 then
      target = suspects
    end
    redis.call('LPUSH', target, raw)
    moved = moved + 1
  end
end
return moved
