-- MIGRATE_LEGACY_REGISTRY: moves every list of the old registry (the plain set of version 0.1)
-- into the new one (a sorted set of registrations), in one step, so that no list is in neither.
--
-- Returns how many lists it moved.
local registry = KEYS[1]       -- the registry of in-flight lists (sorted set)
local legacy = KEYS[2]         -- the legacy registry (plain set)
local now = ARGV[1]

local lists = redis.call('SMEMBERS', legacy)
for _, list in ipairs(lists) do redis.call('ZADD', registry, 'NX', now, list) end
redis.call('DEL', legacy)
return #lists
