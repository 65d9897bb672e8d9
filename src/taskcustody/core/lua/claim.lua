-- CLAIM: a starting process claims its server id with a new incarnation, unless a live process
-- holds the id. A successful claim registers the new incarnation's in-flight lists in the same
-- step, before any of them can hold a task (every take registers its list again, see
-- Worker.take). The incarnation is not a counter kept in Redis: a Redis that restarted empty
-- would count again from 1 and hand a new process the incarnation of a stalled one of the same
-- id that is still running. 62 random bits make that a 1-in-2^62 chance per pair of claims.
--
-- Returns {incarnation, deadline}; incarnation -1 (with the holder's deadline) when a live
-- process holds the id.
local servers = KEYS[1]        -- registered servers, scored by deadline
local incarnations = KEYS[2]   -- server id -> its registered incarnation
local registry = KEYS[3]       -- the registry of in-flight lists
local lists = {}               -- KEYS[4..]: the new incarnation's in-flight lists
for i = 4, #KEYS do lists[i - 3] = KEYS[i] end
local server_id = ARGV[1]
local now = ARGV[2]
local deadline = ARGV[3]       -- the new registration's deadline
local incarnation = ARGV[4]    -- random, drawn by the claimant

local current = redis.call('ZSCORE', servers, server_id)
if current and tonumber(current) > tonumber(now) then
  return {-1, current}
end
redis.call('HSET', incarnations, server_id, incarnation)
redis.call('ZADD', servers, deadline, server_id)
for _, list in ipairs(lists) do redis.call('ZADD', registry, now, list) end
return {incarnation, deadline}
