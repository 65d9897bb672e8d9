-- RELEASE: a worker gives up custody of the task it ran and records the outcome, in one atomic
-- step, so that no client ever sees the task both gone from the worker's list and not yet
-- committed, retried or dead-lettered. It commits only if the task was still in the worker's own
-- list: a worker judged dead has lost custody, and its late release must change nothing.
--
-- Returns {held, length left in the own list, length of the suspects list} (the last tells the
-- worker's process that a suspect waits, at no extra round trip).
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
local raw = ARGV[1]            -- the task's exact bytes in the own list
local task_id = ARGV[2]        -- '' for a malformed envelope (it has no record)
local outcome = ARGV[3]        -- ok | retry | later | dead
local data = ARGV[4]           -- ok: result JSON or ''; retry, later: retried raw; dead: letter
local result_ttl = ARGV[5]     -- seconds (ok with a result)
local track_commits = ARGV[6]  -- 1 | 0
local due = ARGV[7]            -- the due time of a delayed retry (later)

--#include lib/record_owned_by.lua
--#include lib/release_arguments_checked.lua
--#include lib/release_step.lua
return {held, redis.call('LLEN', own), redis.call('LLEN', suspects)}
