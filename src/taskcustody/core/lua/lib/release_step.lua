-- The release step (RELEASE and RELEASE_AND_TAKE include it after the check of their arguments;
-- it reads their header's locals and calls record_owned_by): the task leaves the worker's own
-- list, its processing record is deleted, and only if the task was still in the list (`held`, 1)
-- is its outcome recorded. Only a holder commits: a worker whose list was drained (it was judged
-- dead) lost custody, and the task is someone else's now. A retried task that has a recovery
-- count goes to the suspects list, not the queue: a task with a count runs alone. A delayed retry
-- (later) goes to the scheduled set, scored by the due time the worker drew (docs/protocol.md,
-- section 10); PROMOTE moves it on when it is due.
local held = redis.call('LREM', own, 1, raw)
if task_id ~= '' and record_owned_by(processing, task_id, own) then
  redis.call('HDEL', processing, task_id)
end
if held == 1 then
  local retry = outcome == 'retry' or outcome == 'later'
  if not retry and task_id ~= '' then
    redis.call('HDEL', recoveries, task_id, task_id .. ':from')
  end
  if outcome == 'ok' then
    redis.call('INCR', committed)
    if track_commits == '1' then redis.call('HINCRBY', commit_log, task_id, 1) end
    if data ~= '' then redis.call('SET', result_key, data, 'EX', result_ttl) end
  elseif outcome == 'later' then
    redis.call('ZADD', scheduled, due, data)
  elseif outcome == 'retry' then
    if task_id ~= '' and redis.call('HEXISTS', recoveries, task_id) == 1 then
      redis.call('LPUSH', suspects, data)
    else
      redis.call('LPUSH', queue, data)
    end
  else
    redis.call('LPUSH', dead_letters, data)
  end
end
