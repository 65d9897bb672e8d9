-- PURGE_DEAD: an operator's purge of the dead-letter list, counted and deleted in one step so
-- that the count is exactly what was deleted.
--
-- Returns how many entries were deleted.
local dead_letters = KEYS[1]

local n = redis.call('LLEN', dead_letters)
redis.call('DEL', dead_letters)
return n
