-- DEREGISTER: a process that stops gives up its server id, only if the id is still its own (a
-- newer incarnation may have claimed it while this one stalled).
--
-- Returns 1 if it deregistered, else 0.
local servers = KEYS[1]        -- registered servers, scored by deadline
local incarnations = KEYS[2]   -- server id -> its registered incarnation
local server_id = ARGV[1]
local incarnation = ARGV[2]

if redis.call('HGET', incarnations, server_id) == incarnation then
  redis.call('HDEL', incarnations, server_id)
  redis.call('ZREM', servers, server_id)
  return 1
end
return 0
