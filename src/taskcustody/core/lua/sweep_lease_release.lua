-- SWEEP_LEASE_RELEASE: compare-and-delete. A server shutting down gives up the sweep lease only
-- if it still holds it (it may have lost it while stalled, and the key may be someone else's by
-- now).
--
-- Returns 1 if it deleted the lease, else 0.
local lease = KEYS[1]
local holder = ARGV[1]         -- "<server id>:<incarnation>"

if redis.call('GET', lease) == holder then
  return redis.call('DEL', lease)
end
return 0
