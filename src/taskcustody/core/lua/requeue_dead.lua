-- REQUEUE_DEAD: an operator's requeue of one dead letter: removes that exact entry and pushes the
-- rebuilt envelope, or does nothing if the entry is gone, so that two operators requeueing at
-- once cannot both push it. LPUSH, the producers' end: a requeued task is new work again and
-- waits behind the tasks already queued, as a retry does (RELEASE); RPUSH would put a batch of
-- old failures ahead of everything waiting. Requeued oldest first, a batch keeps the order in
-- which its tasks failed.
--
-- Returns 1 if it requeued the entry, else 0.
local dead_letters = KEYS[1]
local queue = KEYS[2]
local entry = ARGV[1]          -- the exact dead-letter entry
local envelope = ARGV[2]       -- the envelope to enqueue

if redis.call('LREM', dead_letters, 1, entry) == 1 then
  redis.call('LPUSH', queue, envelope)
  return 1
end
return 0
