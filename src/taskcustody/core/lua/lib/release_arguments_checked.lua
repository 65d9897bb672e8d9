-- The release's check of its arguments, before its first write (RELEASE and RELEASE_AND_TAKE
-- include it first; it reads their header's locals outcome, data, result_ttl and due). A refused
-- release writes nothing: Redis never rolls a script back, and a command it refuses half-way
-- leaves the writes before it done. The release's commit used to be such a half: with a result
-- TTL past what SET EX accepts ("invalid expire time in 'set' command") the task left the own
-- list and was counted committed, and its result was never stored. So the arguments Redis could
-- refuse are checked here: the result's TTL (SET EX takes whole seconds, 1 to LLONG_MAX / 1000
-- less the clock; Settings keeps result_ttl at most scripts.MAX_RESULT_TTL, the bound below,
-- which is exact as a Lua number) and a delayed retry's due time (a ZADD score: a number, not
-- NaN). A refusal is an error reply: the task is still in the own list, with its record, and the
-- worker reconciles it (docs/protocol.md, section 2). The first write stays the LREM, which only
-- shrinks memory: under OOM, Redis then lets the whole step run (oom.py), so a release still
-- commits while Redis is out of memory.
if outcome == 'ok' and data ~= '' then
  if not string.match(result_ttl, '^[1-9]%d*$') or tonumber(result_ttl) > 1000000000000000 then
    return redis.error_reply('ERR release refused before any write: result ttl ' .. result_ttl
      .. ' is not a whole number of seconds from 1 to 1000000000000000')
  end
elseif outcome == 'later' then
  local due_time = tonumber(due)
  if not due_time or due_time ~= due_time then
    return redis.error_reply('ERR release refused before any write: due time ' .. due
      .. ' is not a number')
  end
end
