-- FORGET_EMPTY_LIST: a worker that has stopped for good deregisters its own in-flight list, only
-- if the list is empty (a list that holds a task must stay where recovery finds it).
--
-- Returns 1 if it forgot the list, else 0.
local own = KEYS[1]            -- the worker's own in-flight list
local registry = KEYS[2]       -- the registry of in-flight lists

if redis.call('LLEN', own) == 0 then
  return redis.call('ZREM', registry, own)
end
return 0
