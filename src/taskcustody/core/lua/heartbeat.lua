-- HEARTBEAT: a running process renews its server's registration, unless a newer incarnation
-- holds the id: then it was judged dead and replaced, and must stop taking. A registration found
-- gone (a sweep pruned it while the process stalled, or Redis lost its data) is made again, with
-- the process's in-flight lists, so that recovery can find them.
--
-- Returns 1: registered. 2: registered again, the registration was gone, and the lists are
-- registered again too. 0: a newer incarnation holds the id.
local servers = KEYS[1]        -- registered servers, scored by deadline
local incarnations = KEYS[2]   -- server id -> its registered incarnation
local registry = KEYS[3]       -- the registry of in-flight lists
local lists = {}               -- KEYS[4..]: this process's in-flight lists
for i = 4, #KEYS do lists[i - 3] = KEYS[i] end
local server_id = ARGV[1]
local incarnation = ARGV[2]
local deadline = ARGV[3]
local now = ARGV[4]

local current = redis.call('HGET', incarnations, server_id)
if current and current ~= incarnation then return 0 end
redis.call('HSET', incarnations, server_id, incarnation)
redis.call('ZADD', servers, deadline, server_id)
if current then return 1 end
for _, list in ipairs(lists) do redis.call('ZADD', registry, now, list) end
return 2
