-- DRAIN_CHUNK: recovery of a dead holder's in-flight list, a chunk at a time. Moves at most
-- max_moves tasks back, each with its processing record: a counted task (poison-pill detection
-- on) to the suspects list's far end (first in, first out), never back to the queue beside the
-- tasks it died with; an uncounted one to the queue's take end. In dead-only mode only while the
-- list's owner is not live -- re-checked inside the step, so a server that re-registered since
-- the caller looked is never drained. Each task's recovery is counted in this same step, and a
-- task recovered once too often is dead-lettered instead of requeued.
--
-- Returns {moves, then per poison pill: task id, recoveries, holders}, or {-1} if the owner is
-- live.
local inflight = KEYS[1]         -- the list to drain
local queue = KEYS[2]
local processing = KEYS[3]       -- processing records: task id -> "<list key> <started>"
local servers = KEYS[4]          -- registered servers, scored by deadline
local incarnations = KEYS[5]     -- server id -> its registered incarnation
local recoveries = KEYS[6]       -- recovery counts (lib/recovered.lua)
local dead_letters = KEYS[7]
local suspects = KEYS[8]
local max_moves = ARGV[1]
local server_id = ARGV[2]        -- the list's owner
local incarnation = ARGV[3]      -- the owner's incarnation the list belongs to
local mode = ARGV[4]             -- force | dead-only
local max_recoveries = ARGV[5]   -- '' = none (no counting)
local now = ARGV[6]

--#include lib/is_live.lua
--#include lib/record_owned_by.lua
--#include lib/recovered.lua
if mode ~= 'force' and is_live(servers, incarnations, server_id, incarnation) then
  return {-1}
end
local out = {0}
local limit = tonumber(max_moves)
local holder = server_id .. '#' .. incarnation
while out[1] < limit do
  local raw = redis.call('LINDEX', inflight, -1)
  if not raw then break end
  out[1] = out[1] + 1
  local ok, task = pcall(cjson.decode, raw)
  local id = nil
  if ok and type(task) == 'table' and type(task['id']) == 'string' then id = task['id'] end
  -- The first write is one that may grow memory (the count, or the move), so that a Redis out
  -- of memory refuses the whole step rather than running it after a deletion.
  local dead = recovered(recoveries, id, raw, holder, max_recoveries, now)
  if dead then
    redis.call('RPOP', inflight)
    redis.call('LPUSH', dead_letters, dead)
    out[#out + 1] = id
    out[#out + 1] = tonumber(max_recoveries) + 1
    out[#out + 1] = cjson.decode(dead)['holders']
  elseif max_recoveries ~= '' and id then
    redis.call('LMOVE', inflight, suspects, 'RIGHT', 'LEFT')
  else
    redis.call('LMOVE', inflight, queue, 'RIGHT', 'RIGHT')
  end
  if id and record_owned_by(processing, id, inflight) then
    redis.call('HDEL', processing, id)
  end
end
return out
