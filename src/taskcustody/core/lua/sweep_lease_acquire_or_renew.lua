-- SWEEP_LEASE_ACQUIRE_OR_RENEW: a server asks for the sweep lease (one sweeper at a time): it
-- renews the lease if it holds it, takes it if nobody does. Only the holder extends it: a server
-- that is not the holder never touches the expiry, so a dead holder's lease lapses on time
-- however many servers keep asking.
--
-- Returns 1: we hold the lease (renewed, or just taken); 0: someone else holds it.
local lease = KEYS[1]
local holder = ARGV[1]         -- "<server id>:<incarnation>"
local ttl_ms = ARGV[2]         -- the lease's expiry, in milliseconds

local current = redis.call('GET', lease)
if current == holder then
  redis.call('PEXPIRE', lease, ttl_ms)
  return 1
end
if current then return 0 end
redis.call('SET', lease, holder, 'NX', 'PX', ttl_ms)
return 1
