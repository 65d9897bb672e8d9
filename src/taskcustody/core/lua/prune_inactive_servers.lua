-- PRUNE_INACTIVE_SERVERS: the sweep unregisters every server whose deadline has passed, in one
-- step, so that their lists count as dead from then on (liveness is registration, not the
-- clock: lib/is_live.lua).
--
-- Returns the server ids it pruned.
local servers = KEYS[1]        -- registered servers, scored by deadline
local incarnations = KEYS[2]   -- server id -> its registered incarnation
local now = ARGV[1]

local expired = redis.call('ZRANGEBYSCORE', servers, '-inf', now)
for _, server_id in ipairs(expired) do
  redis.call('HDEL', incarnations, server_id)
  redis.call('ZREM', servers, server_id)
end
return expired
