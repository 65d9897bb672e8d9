-- REQUEUE_STUCK: the processing sweep's recovery of one task whose record names the in-flight
-- list of a holder that is not live. The task goes back to the queue only in the step that
-- removes it from the holder's list, so the drain and this sweep can never both requeue it; a
-- counted task goes to the suspects list, and a task recovered once too often is dead-lettered
-- (counted in this step, like every recovery). A record whose task is no longer in that list is
-- stale and deleted.
--
-- Returns 0: left alone (no record, record changed hands, or owner live); 1: requeued out of
-- custody; 2: stale record deleted; 3: dead-lettered as a poison pill.
local processing = KEYS[1]       -- processing records: task id -> "<list key> <started>"
local queue = KEYS[2]
local holder_list = KEYS[3]      -- the in-flight list the task's record names
local servers = KEYS[4]          -- registered servers, scored by deadline
local incarnations = KEYS[5]     -- server id -> its registered incarnation
local recoveries = KEYS[6]       -- recovery counts (lib/recovered.lua)
local dead_letters = KEYS[7]
local suspects = KEYS[8]
local task_id = ARGV[1]
local server_id = ARGV[2]        -- the list's owner
local incarnation = ARGV[3]      -- the owner's incarnation the list belongs to
local max_recoveries = ARGV[4]   -- '' = none (no counting)
local now = ARGV[5]

--#include lib/is_live.lua
--#include lib/record_owned_by.lua
--#include lib/recovered.lua
if not record_owned_by(processing, task_id, holder_list) then return 0 end
if is_live(servers, incarnations, server_id, incarnation) then return 0 end
for _, raw in ipairs(redis.call('LRANGE', holder_list, 0, -1)) do
  local ok, task = pcall(cjson.decode, raw)
  if ok and type(task) == 'table' and task['id'] == task_id then
    redis.call('LREM', holder_list, 1, raw)
    redis.call('HDEL', processing, task_id)
    local dead = recovered(recoveries, task_id, raw, server_id .. '#' .. incarnation,
                           max_recoveries, now)
    if dead then
      redis.call('LPUSH', dead_letters, dead)
      return 3
    end
    if max_recoveries ~= '' then
      redis.call('LPUSH', suspects, raw)
    else
      redis.call('RPUSH', queue, raw)
    end
    return 1
  end
end
redis.call('HDEL', processing, task_id)
return 2
