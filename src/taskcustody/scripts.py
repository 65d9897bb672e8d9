"""The Lua scripts: each is one atomic step of the protocol.

A script is atomic in Redis, so whatever a script does happens entirely or not at all, and no other
client sees a half-done step. That is how custody moves: a task leaves a holder's in-flight list in
the same step that puts it somewhere else. Every key a script touches is passed in KEYS and shares
the queue's hash tag, so the scripts run on Redis Cluster too.

Processing records are stored as "<in-flight list key> <started>" so that a script can tell whose
record it is with one string comparison (list keys never contain spaces).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

#: The longest result TTL, in seconds (some 31 million years; Settings.result_ttl is kept at most
#: this, and RELEASE refuses more): Redis refuses a `SET ... EX` above LLONG_MAX / 1000 s or one
#: whose milliseconds overflow once added to its clock, some 9.22 * 10**15 s today, and 10**15
#: stays below that for millions of years; it is exact as a Lua number (a double), so the script
#: compares it exactly. Defined here, not in settings.py: this module imports nothing of ours
#: (the mutation gate loads it on its own).
MAX_RESULT_TTL = 10**15

# A list is live iff its server is registered with the list's incarnation. Registration, not the
# clock: a server whose deadline has passed stays live until a sweep prunes it -- which is why the
# sweep prunes before it drains (or recovery would lag a whole period behind).
_LIVE = """
local function is_live(servers, incarnations, server_id, incarnation)
  if not redis.call('ZSCORE', servers, server_id) then return false end
  return redis.call('HGET', incarnations, server_id) == incarnation
end
"""

_RECORD_OWNED_BY = """
local function record_owned_by(processing, task_id, list_key)
  local rec = redis.call('HGET', processing, task_id)
  return rec and string.sub(rec, 1, #list_key + 1) == list_key .. ' '
end
"""

# Poison pills (a task that kills the process that runs it): every recovery of a task from a
# holder's list counts it, in the step that recovers it, in the hash of recovery counts (field
# <task id>: count; field <task id>:from: the holders that died with it). Past the limit the same
# step dead-letters the task instead of requeueing it. A commit (or a dead letter) deletes both.
_RECOVERED = """
local function b64(data)
  local alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
  return ((data:gsub('.', function(x)
    local r, b = '', x:byte()
    for i = 8, 1, -1 do r = r .. (b % 2 ^ i - b % 2 ^ (i - 1) > 0 and '1' or '0') end
    return r
  end) .. '0000'):gsub('%d%d%d?%d?%d?%d?', function(x)
    if #x < 6 then return '' end
    local c = 0
    for i = 1, 6 do c = c + (x:sub(i, i) == '1' and 2 ^ (6 - i) or 0) end
    return alphabet:sub(c + 1, c + 1)
  end) .. ({'', '==', '='})[#data % 3 + 1])
end

-- Counts one recovery of task `id` (raw envelope `raw`) from the list of holder `holder`.
-- Returns nil to requeue it, or the dead letter to push instead (a poison pill).
local function recovered(counts, id, raw, holder, limit, now)
  if limit == '' or not id then return nil end
  local n = redis.call('HINCRBY', counts, id, 1)
  local from = redis.call('HGET', counts, id .. ':from')
  from = (from and (from .. ',') or '') .. holder
  if n <= tonumber(limit) then
    redis.call('HSET', counts, id .. ':from', from)
    return nil
  end
  redis.call('HDEL', counts, id, id .. ':from')
  return cjson.encode({raw = b64(raw), task_id = id, at = tonumber(now), poison = true,
                       recoveries = n, holders = from,
                       error = 'poison pill: recovered ' .. n .. ' times from holders that died'})
end
"""

# A refused release writes nothing. Redis never rolls a script back: a command it refuses
# half-way leaves the writes before it done. The release's commit used to be such a half: with a
# result TTL past what SET EX accepts ("invalid expire time in 'set' command") the task left the
# own list and was counted committed, and its result was never stored. So the arguments Redis
# could refuse are checked here, before the first write: the result's TTL (SET EX takes whole
# seconds, 1 to LLONG_MAX / 1000 less the clock; Settings keeps result_ttl at most
# MAX_RESULT_TTL, which is below that and exact as a Lua number) and a delayed retry's due time
# (a ZADD score: a number, not NaN). A refusal is an error reply: the task is still in the own
# list, with its record, and the worker reconciles it (docs/protocol.md, section 2). The first
# write stays the LREM, which only shrinks memory: under OOM, Redis then lets the whole step run
# (oom.py), so a release still commits while Redis is out of memory.
_RELEASE_ARGUMENTS_CHECKED = f"""
if ARGV[3] == 'ok' and ARGV[4] ~= '' then
  if not string.match(ARGV[5], '^[1-9]%d*$') or tonumber(ARGV[5]) > {MAX_RESULT_TTL} then
    return redis.error_reply('ERR release refused before any write: result ttl ' .. ARGV[5]
      .. ' is not a whole number of seconds from 1 to {MAX_RESULT_TTL}')
  end
elseif ARGV[3] == 'later' then
  local due = tonumber(ARGV[7])
  if not due or due ~= due then
    return redis.error_reply('ERR release refused before any write: due time ' .. ARGV[7]
      .. ' is not a number')
  end
end
"""

# KEYS: own list, processing, queue, dead letters, committed, commit log, result key,
#       recovery counts, suspects, scheduled
# ARGV: raw task, task id, outcome (ok|retry|later|dead), data (result JSON | retried raw | dead
#       letter), result ttl, track commits (1|0), due time (for later)
# Returns {held, length left in the own list, length of the suspects list} (the last tells the
# worker's process that a suspect waits, at no extra round trip). A retried task that has a
# recovery count goes to the suspects list, not the queue: a task with a count runs alone. A
# delayed retry (later) goes to the scheduled set, scored by the due time the worker drew
# (docs/protocol.md, section 10); PROMOTE moves it on when it is due.
_RELEASE_STEP = (
    _RECORD_OWNED_BY
    + _RELEASE_ARGUMENTS_CHECKED
    + """
local held = redis.call('LREM', KEYS[1], 1, ARGV[1])
if ARGV[2] ~= '' and record_owned_by(KEYS[2], ARGV[2], KEYS[1]) then
  redis.call('HDEL', KEYS[2], ARGV[2])
end
-- Only a holder commits: a worker whose list was drained (it was judged dead) lost custody, and the
-- task is someone else's now.
if held == 1 then
  local retry = ARGV[3] == 'retry' or ARGV[3] == 'later'
  if not retry and ARGV[2] ~= '' then
    redis.call('HDEL', KEYS[8], ARGV[2], ARGV[2] .. ':from')
  end
  if ARGV[3] == 'ok' then
    redis.call('INCR', KEYS[5])
    if ARGV[6] == '1' then redis.call('HINCRBY', KEYS[6], ARGV[2], 1) end
    if ARGV[4] ~= '' then redis.call('SET', KEYS[7], ARGV[4], 'EX', ARGV[5]) end
  elseif ARGV[3] == 'later' then
    redis.call('ZADD', KEYS[10], ARGV[7], ARGV[4])
  elseif ARGV[3] == 'retry' then
    if ARGV[2] ~= '' and redis.call('HEXISTS', KEYS[8], ARGV[2]) == 1 then
      redis.call('LPUSH', KEYS[9], ARGV[4])
    else
      redis.call('LPUSH', KEYS[3], ARGV[4])
    end
  else
    redis.call('LPUSH', KEYS[4], ARGV[4])
  end
end
"""
)

RELEASE = _RELEASE_STEP + """
return {held, redis.call('LLEN', KEYS[1]), redis.call('LLEN', KEYS[9])}
"""

# The default busy cycle: the release above and the take of the next task, in ONE atomic step, so
# that a worker that handles one task at a time pays one round trip per task (issue 13) and
# nothing can come between giving up one task and taking custody of the next.
# KEYS: RELEASE's ten, then the registry of in-flight lists
# ARGV: RELEASE's seven, then what to take ('' nothing | 'queue' | 'suspect': the oldest suspect
#       if one waits, else from the queue; the worker says 'suspect' only while its process holds
#       no suspect but perhaps this task), the next task's processing record, now (the list's
#       registration score)
# The take runs only after the release, and only if the release left our list empty: debris in it
# (remaining > 0) makes the worker dirty, and a dirty worker reconciles before it takes anything.
# It is take_suspect's or TAKE_AND_RECORD's step (register the list, LMOVE into it, HSET the
# record), so a lost reply is a lost reply of both halves: the worker does not know whether it
# committed or what it holds, is dirty, and its reconcile drains the taken task back.
# Returns RELEASE's {held, remaining, suspects waiting}, then, if it took one, the raw task, its
# id ('' for a malformed envelope: no record) and 1 if it came from the suspects list, else 0.
_TAKE_NEXT = """
local remaining = redis.call('LLEN', KEYS[1])
local waiting = redis.call('LLEN', KEYS[9])
if remaining > 0 or ARGV[8] == '' then return {held, remaining, waiting} end
local source, suspect = KEYS[3], 0
if ARGV[8] == 'suspect' and waiting > 0 then source, suspect = KEYS[9], 1 end
local raw = redis.call('LMOVE', source, KEYS[1], 'RIGHT', 'LEFT')
if not raw then return {held, 0, waiting} end
redis.call('ZADD', KEYS[11], ARGV[10], KEYS[1])
local id = ''
local ok, task = pcall(cjson.decode, raw)
if ok and type(task) == 'table' and type(task['id']) == 'string' and task['id'] ~= '' then
  id = task['id']
  redis.call('HSET', KEYS[2], id, ARGV[9])
end
return {held, 0, waiting - suspect, raw, id, suspect}
"""
RELEASE_AND_TAKE = _RELEASE_STEP + _TAKE_NEXT

# KEYS: own list, processing
# ARGV: raw task, task id, record value
# Writes the processing record only while the task is still in our list. A worker judged dead
# (stalled) may record after its task was drained and taken by someone else: an unconditional
# HSET would overwrite the new holder's record with a stale one that nothing ever deletes.
RECORD = """
if redis.call('LPOS', KEYS[1], ARGV[1]) then
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
  return 1
end
return 0
"""

# KEYS: queue, own list, processing, registry of in-flight lists
# ARGV: record value, now
# A take that never blocks: our list is registered, the task moves from the queue's take end
# into it and its processing record is written, in one atomic step (so no stall can come between
# them, and no guard is needed: the task is surely ours). Returns {task, id recorded ('' if
# none)}, or false when the queue is empty. A prefetching worker sends several of these in one
# round trip while the queue is busy. With the suspects list in place of the queue it is the
# take of a suspect (Worker.take_suspect; FIFO: recovery pushes suspects on the left). An
# envelope with no usable id is moved without a record; the worker dead-letters it, and the id
# returned here (not the worker's own parse) tells its release which record to delete.
TAKE_AND_RECORD = """
redis.call('ZADD', KEYS[4], ARGV[2], KEYS[2])
local raw = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
if not raw then return false end
local ok, task = pcall(cjson.decode, raw)
if ok and type(task) == 'table' and type(task['id']) == 'string' and task['id'] ~= '' then
  redis.call('HSET', KEYS[3], task['id'], ARGV[1])
  return {raw, task['id']}
end
return {raw, ''}
"""

# KEYS: in-flight list, queue, processing, servers, incarnations, recovery counts, dead letters,
#       suspects
# ARGV: max moves, server id, incarnation, mode (force | dead-only), max recoveries ('' = none),
#       now
# Moves at most ARGV[1] tasks back, each with its processing record: a counted task (poison-pill
# detection on) to the suspects list's far end (first in, first out), never back to the queue
# beside the tasks it died with; an uncounted one to the queue's take end. Only while the list's
# owner is not live (dead-only) -- re-checked inside the step, so a server that re-registered
# since the caller looked is never drained. Each task's recovery is counted
# in this same step, and a task recovered once too often is dead-lettered instead of requeued.
# Returns {moves, then per poison pill: task id, recoveries, holders}.
DRAIN_CHUNK = (
    _LIVE
    + _RECORD_OWNED_BY
    + _RECOVERED
    + """
if ARGV[4] ~= 'force' and is_live(KEYS[4], KEYS[5], ARGV[2], ARGV[3]) then
  return {-1}
end
local out = {0}
local limit = tonumber(ARGV[1])
local holder = ARGV[2] .. '#' .. ARGV[3]
while out[1] < limit do
  local raw = redis.call('LINDEX', KEYS[1], -1)
  if not raw then break end
  out[1] = out[1] + 1
  local ok, task = pcall(cjson.decode, raw)
  local id = nil
  if ok and type(task) == 'table' and type(task['id']) == 'string' then id = task['id'] end
  -- The first write is one that may grow memory (the count, or the move), so that a Redis out
  -- of memory refuses the whole step rather than running it after a deletion.
  local dead = recovered(KEYS[6], id, raw, holder, ARGV[5], ARGV[6])
  if dead then
    redis.call('RPOP', KEYS[1])
    redis.call('LPUSH', KEYS[7], dead)
    out[#out + 1] = id
    out[#out + 1] = tonumber(ARGV[5]) + 1
    out[#out + 1] = cjson.decode(dead)['holders']
  elseif ARGV[5] ~= '' and id then
    redis.call('LMOVE', KEYS[1], KEYS[8], 'RIGHT', 'LEFT')
  else
    redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'RIGHT')
  end
  if id and record_owned_by(KEYS[3], id, KEYS[1]) then
    redis.call('HDEL', KEYS[3], id)
  end
end
return out
"""
)

# KEYS: servers, incarnations, registry of in-flight lists, then the new incarnation's lists
# ARGV: server id, now, deadline, incarnation (random, drawn by the claimant)
# Returns {incarnation, deadline}; incarnation -1 when a live process holds the id. A successful
# claim registers the new incarnation's in-flight lists in the same step (before any of them can
# hold a task; every take registers its list again, see Worker.take).
# The incarnation is not a counter kept in Redis: a Redis that restarted empty would count again
# from 1 and hand a new process the incarnation of a stalled one of the same id that is still
# running. 62 random bits make that a 1-in-2^62 chance per pair of claims.
CLAIM = """
local deadline = redis.call('ZSCORE', KEYS[1], ARGV[1])
if deadline and tonumber(deadline) > tonumber(ARGV[2]) then
  return {-1, deadline}
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
for i = 4, #KEYS do redis.call('ZADD', KEYS[3], ARGV[2], KEYS[i]) end
return {ARGV[4], ARGV[3]}
"""

# KEYS: servers, incarnations, registry of in-flight lists, then our in-flight lists
# ARGV: server id, incarnation, deadline, now
# 1: registered. 2: registered again, our registration was gone (a sweep pruned us while we
# stalled, or Redis lost its data): our lists are registered again too. 0: a newer incarnation
# holds the id -- we were judged dead and replaced, and must stop taking.
HEARTBEAT = """
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current and current ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
if current then return 1 end
for i = 4, #KEYS do redis.call('ZADD', KEYS[3], ARGV[4], KEYS[i]) end
return 2
"""

# KEYS: servers, incarnations
# ARGV: server id, incarnation
DEREGISTER = """
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
"""

# KEYS: servers, incarnations
# ARGV: now
PRUNE_INACTIVE_SERVERS = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, server_id in ipairs(expired) do
  redis.call('HDEL', KEYS[2], server_id)
  redis.call('ZREM', KEYS[1], server_id)
end
return expired
"""

# KEYS: processing, queue, in-flight list named by the record, servers, incarnations, recovery
#       counts, dead letters, suspects
# ARGV: task id, server id, incarnation, max recoveries ('' = none), now
# 0: left alone (no record, record changed hands, or owner live); 1: requeued out of custody;
# 2: stale record deleted (the task was no longer in that list); 3: dead-lettered as a poison pill
# (recovered once too often; counted in this step, like every recovery).
# The task goes back to the queue only in the step that removes it from the holder's list: the
# drain and this sweep can never both requeue it. A counted task goes to the suspects list.
REQUEUE_STUCK = (
    _LIVE
    + _RECORD_OWNED_BY
    + _RECOVERED
    + """
if not record_owned_by(KEYS[1], ARGV[1], KEYS[3]) then return 0 end
if is_live(KEYS[4], KEYS[5], ARGV[2], ARGV[3]) then return 0 end
for _, raw in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local ok, task = pcall(cjson.decode, raw)
  if ok and type(task) == 'table' and task['id'] == ARGV[1] then
    redis.call('LREM', KEYS[3], 1, raw)
    redis.call('HDEL', KEYS[1], ARGV[1])
    local dead = recovered(KEYS[6], ARGV[1], raw, ARGV[2] .. '#' .. ARGV[3], ARGV[4], ARGV[5])
    if dead then
      redis.call('LPUSH', KEYS[7], dead)
      return 3
    end
    if ARGV[4] ~= '' then
      redis.call('LPUSH', KEYS[8], raw)
    else
      redis.call('RPUSH', KEYS[2], raw)
    end
    return 1
  end
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 2
"""
)

# KEYS: own list, registry
# ARGV: none. Deregistering an empty list is safe only when its worker has stopped for good.
FORGET_EMPTY_LIST = """
if redis.call('LLEN', KEYS[1]) == 0 then
  return redis.call('ZREM', KEYS[2], KEYS[1])
end
return 0
"""

# KEYS: registry, servers, incarnations, then up to 100 in-flight lists
# ARGV: cutoff (now - grace), then per list: owner's server id, owner's incarnation
# The registry's garbage collection: forgets each list that is empty, whose owner is not live,
# and whose last registration is not younger than the cutoff -- all re-checked inside this one
# step. Why the age: a take registers its list (ZADD, score = now) in the same write as its
# BLMOVE, and Redis serves or times out that BLMOVE within the block timeout, which the grace
# exceeds. So an older registration has no take pending behind it that could still fill the
# list; a take sent later registers the list again first. Returns the lists forgotten.
FORGET_DEAD_EMPTY_LISTS = (
    _LIVE
    + """
local forgotten = {}
for i = 4, #KEYS do
  local owner, incarnation = ARGV[2 * (i - 3)], ARGV[2 * (i - 3) + 1]
  local registered = redis.call('ZSCORE', KEYS[1], KEYS[i])
  if registered and tonumber(registered) <= tonumber(ARGV[1])
     and redis.call('LLEN', KEYS[i]) == 0
     and not is_live(KEYS[2], KEYS[3], owner, incarnation) then
    redis.call('ZREM', KEYS[1], KEYS[i])
    forgotten[#forgotten + 1] = KEYS[i]
  end
end
return forgotten
"""
)

# KEYS: registry (sorted set), legacy registry (the plain set of version 0.1)
# ARGV: now
# Moves every list of the old registry into the new one, in one step.
MIGRATE_LEGACY_REGISTRY = """
local lists = redis.call('SMEMBERS', KEYS[2])
for _, list in ipairs(lists) do redis.call('ZADD', KEYS[1], 'NX', ARGV[1], list) end
redis.call('DEL', KEYS[2])
return #lists
"""

# KEYS: scheduled, queue, suspects, recovery counts
# ARGV: now, batch size
# Moves every due member of the scheduled set (score <= now, at most a batch, earliest first) to
# the queue's far end (LPUSH: behind the queued tasks, as an immediate retry), or to the suspects
# list if its task has a recovery count (it still runs alone). The ZREM decides: a member is
# pushed only by the step that removed it, so two promoters never move one member twice, and a
# task is never in both places nor in neither. Returns the number moved.
PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local moved = 0
for _, raw in ipairs(due) do
  if redis.call('ZREM', KEYS[1], raw) == 1 then
    local target = KEYS[2]
    local ok, task = pcall(cjson.decode, raw)
    if ok and type(task) == 'table' and type(task['id']) == 'string'
        and redis.call('HEXISTS', KEYS[4], task['id']) == 1 then
      target = KEYS[3]
    end
    redis.call('LPUSH', target, raw)
    moved = moved + 1
  end
end
return moved
"""


#: Every Lua script above, by name: exactly what the mutation gate loads as Lua to reject a
#: mutant that does not compile (mutation/gate.py). The module's other constants are not Lua.
LUA: dict[str, str] = {
    "RELEASE": RELEASE,
    "RELEASE_AND_TAKE": RELEASE_AND_TAKE,
    "RECORD": RECORD,
    "TAKE_AND_RECORD": TAKE_AND_RECORD,
    "DRAIN_CHUNK": DRAIN_CHUNK,
    "CLAIM": CLAIM,
    "HEARTBEAT": HEARTBEAT,
    "DEREGISTER": DEREGISTER,
    "PRUNE_INACTIVE_SERVERS": PRUNE_INACTIVE_SERVERS,
    "REQUEUE_STUCK": REQUEUE_STUCK,
    "FORGET_EMPTY_LIST": FORGET_EMPTY_LIST,
    "FORGET_DEAD_EMPTY_LISTS": FORGET_DEAD_EMPTY_LISTS,
    "MIGRATE_LEGACY_REGISTRY": MIGRATE_LEGACY_REGISTRY,
    "PROMOTE": PROMOTE,
}


@dataclass(frozen=True)
class Script:
    """A script called by hash, as redis-py's `Script` holds one but without a client (a worker
    sends it on its own connection): its source, sent with EVAL when Redis answers NOSCRIPT, and
    the SHA1 that EVALSHA names it by, computed once."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())

    def load(self, client: redis.Redis) -> None:
        """SCRIPT LOAD: from now on EVALSHA finds it (until the script cache is flushed)."""
        client.script_load(self.source)


# The scripts a worker (worker.py, prefetch.py) calls by hash.
RECORD_SCRIPT = Script(RECORD)
RELEASE_SCRIPT = Script(RELEASE)
TAKE_AND_RECORD_SCRIPT = Script(TAKE_AND_RECORD)
RELEASE_AND_TAKE_SCRIPT = Script(RELEASE_AND_TAKE)
