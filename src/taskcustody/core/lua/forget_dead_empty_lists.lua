-- FORGET_DEAD_EMPTY_LISTS: the registry's garbage collection. Forgets each list that is empty,
-- whose owner is not live, and whose last registration is not younger than the cutoff -- all
-- re-checked inside this one step. Why the age: a take registers its list (ZADD, score = now) in
-- the same write as its BLMOVE, and Redis serves or times out that BLMOVE within the block
-- timeout, which the grace exceeds. So an older registration has no take pending behind it that
-- could still fill the list; a take sent later registers the list again first.
--
-- Returns the lists forgotten.
local registry = KEYS[1]       -- the registry of in-flight lists
local servers = KEYS[2]        -- registered servers, scored by deadline
local incarnations = KEYS[3]   -- server id -> its registered incarnation
local cutoff = ARGV[1]         -- now - grace
-- KEYS[4..]: up to 100 in-flight lists; ARGV[2..]: per list, its owner's server id and its
-- owner's incarnation
local lists, owners, owner_incarnations = {}, {}, {}
for i = 4, #KEYS do
  local n = i - 3
  lists[n], owners[n], owner_incarnations[n] = KEYS[i], ARGV[2 * n], ARGV[2 * n + 1]
end

--#include lib/is_live.lua
local forgotten = {}
for n, list in ipairs(lists) do
  local registered = redis.call('ZSCORE', registry, list)
  if registered and tonumber(registered) <= tonumber(cutoff)
     and redis.call('LLEN', list) == 0
     and not is_live(servers, incarnations, owners[n], owner_incarnations[n]) then
    redis.call('ZREM', registry, list)
    forgotten[#forgotten + 1] = list
  end
end
return forgotten
