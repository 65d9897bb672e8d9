-- RELEASE_AND_TAKE: RELEASE and the take of the next task in ONE atomic step, the default busy
-- cycle, so that a worker that handles one task at a time pays one round trip per task and
-- nothing can come between giving up one task and taking custody of the next. The take runs
-- only after the release, and only if the release left the own list empty: debris in it makes
-- the worker dirty, and a dirty worker reconciles before it takes anything. The take is
-- TAKE_AND_RECORD's (register the list, LMOVE into it, HSET the record), so a lost reply is a
-- lost reply of both halves: the worker does not know whether it committed or what it holds, is
-- dirty, and its reconcile drains the taken task back.
--
-- Returns RELEASE's {held, remaining, suspects waiting}, then, if it took one, the raw task, its
-- id ('' for a malformed envelope: no record) and 1 if it came from the suspects list, else 0.
local own = KEYS[1]            -- the worker's own in-flight list
local processing = KEYS[2]     -- processing records: task id -> "<list key> <started>"
local queue = KEYS[3]
local dead_letters = KEYS[4]
local committed = KEYS[5]      -- the count of commits
local commit_log = KEYS[6]     -- commits per task id (when tracked)
local result_key = KEYS[7]     -- where an ok outcome's result goes
local recoveries = KEYS[8]     -- recovery counts (lib/recovered.lua)
local suspects = KEYS[9]       -- the tasks that have a recovery count, each to run alone
local scheduled = KEYS[10]     -- delayed retries, scored by their due time
local registry = KEYS[11]      -- the registry of in-flight lists
local raw = ARGV[1]            -- the released task's exact bytes in the own list
local task_id = ARGV[2]        -- '' for a malformed envelope (it has no record)
local outcome = ARGV[3]        -- ok | retry | later | dead
local data = ARGV[4]           -- ok: result JSON or ''; retry, later: retried raw; dead: letter
local result_ttl = ARGV[5]     -- seconds (ok with a result)
local track_commits = ARGV[6]  -- 1 | 0
local due = ARGV[7]            -- the due time of a delayed retry (later)
local take = ARGV[8]           -- '' nothing | 'queue' | 'suspect': the oldest suspect if one
                               -- waits, else from the queue (said only while the worker's
                               -- process holds no suspect but perhaps this task)
local record = ARGV[9]         -- the next task's processing record
local now = ARGV[10]           -- the list's registration score

--#include lib/record_owned_by.lua
--#include lib/release_arguments_checked.lua
--#include lib/release_step.lua
local remaining = redis.call('LLEN', own)
local waiting = redis.call('LLEN', suspects)
if remaining > 0 or take == '' then return {held, remaining, waiting} end
local source, suspect = queue, 0
if take == 'suspect' and waiting > 0 then source, suspect = suspects, 1 end
local taken = redis.call('LMOVE', source, own, 'RIGHT', 'LEFT')
if not taken then return {held, 0, waiting} end
redis.call('ZADD', registry, now, own)
local id = ''
local ok, task = pcall(cjson.decode, taken)
if ok and type(task) == 'table' and type(task['id']) == 'string' and task['id'] ~= '' then
  id = task['id']
  redis.call('HSET', processing, id, record)
end
return {held, 0, waiting - suspect, taken, id, suspect}
