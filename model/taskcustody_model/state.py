"""The model's state: immutable, hashable, plain tuples.

Everything here is data.  The protocol steps that change it live in ``protocol.py``.

Why tuples and ``NamedTuple`` rather than frozen dataclasses: the checker hashes and compares
millions of states; a NamedTuple *is* a tuple (hashing and equality run in C), and still reads
like a record.

Time is kept **relative**: a server registration stores ``deadline - now`` clamped at 0
(0 = expired but not yet pruned).  The protocol only ever compares a deadline with *now*, and
every deadline is set to ``now + TTL``, so relative deadlines are an exact abstraction of the
global clock.  That is also why the state space is finite without a clock horizon.
"""

from __future__ import annotations

from typing import NamedTuple

# --- the clock -----------------------------------------------------------------------------------
#: A heartbeat sets the deadline to now + TTL.  Healthy servers renew before every tick (see
#: ``protocol.renewed``), so one tick without renewal expires a registration: deadlines are
#: 1 (registered) or 0 (expired, not yet pruned).
TTL = 1

# --- worker phases -------------------------------------------------------------------------------
IDLE = 0  # holds nothing, may take
DIRTY = 1  # holds nothing, but its in-flight list may hold debris: reconcile before the next take
TAKEN = 2  # knows its task (the take's reply arrived); next: record
RECORDED = 3  # processing record written; next: execute and release
CRASHED = 4  # stopped between two commands; no ``finally`` ran; the supervisor may restart it
STOPPED = 5  # its process was superseded and it finished: it will never run again
#: its take is pending in Redis: the take pipeline registered the list (ZADD to the registry) and
#: sent BLMOVE, which blocks on an empty queue; Redis serves it when a task arrives (``take``)
ARMED = 6

PHASE_NAMES = ("idle", "dirty", "taken", "recorded", "crashed", "stopped", "armed")
HOLDING = (TAKEN, RECORDED)

# --- process phases ------------------------------------------------------------------------------
CLAIMED = 0  # claimed its server id (a new incarnation); startup drain not started
STARTING = 1  # startup drain in progress (``Process.drains`` holds its work)
RUNNING = 2  # workers take work; heartbeats, sweeps and processing sweeps run
SUPERSEDED = 3  # a heartbeat found a newer incarnation: stop taking, finish, exit

PROCESS_PHASE_NAMES = ("claimed", "starting", "running", "superseded")

NO_TASK = -1

# --- what happened to a task, outside Redis (ghost records: what the producer and the handlers saw)
ENQUEUED = 0  # the producer's LPUSH succeeded
WAITING = 1  # not yet enqueued (``Bounds.late_tasks``): the ``enqueue`` action pushes it
WIPED = 2  # Redis lost it (a ``redis_wipe`` while it was neither committed nor waiting): not ours
#: recovered from a dead holder more than ``Bounds.max_recoveries`` times: a poison pill, moved to
#: the dead letters in the step that recovered it (an end, like a commit)
POISONED = 3

TASK_STATUS_NAMES = ("enqueued", "waiting", "wiped", "poison pill")

#: An in-flight list key: (server id, incarnation, worker index), inflight:<server>:<inc>:<worker>
ListKey = tuple[int, int, int]


class Worker(NamedTuple):
    phase: int
    task: int = NO_TASK  # the task it believes it holds (TAKEN/RECORDED), else NO_TASK


class Drain(NamedTuple):
    """One list being drained: at most ``length`` moves, ``length`` read up front (LLEN)."""

    key: ListKey
    length: int
    moved: int


class Process(NamedTuple):
    """One running (or stalled) process holding server id ``server`` as incarnation ``inc``.

    Crashed processes are simply removed from the state: a crash leaves nothing but Redis state.
    """

    inc: int
    stalled: bool
    phase: int
    #: the drains of the current startup drain or sweep pass, first one in progress
    drains: tuple[Drain, ...]
    workers: tuple[Worker, ...]
    #: only in design 11 (``counts_recoveries_apart``): tasks this process recovered whose
    #: recovery count it has not written yet (a crash in between loses the count)
    pending_counts: tuple[int, ...] = ()
    #: the process's suspect slot: the worker that took a suspect (a task whose recovery count
    #: is >= 1) and is not clean again yet, or -1.  At most one suspect per process at a time.
    suspect: int = -1


class Registration(NamedTuple):
    """The server registry entry: zset score (relative deadline) + the incarnations hash."""

    inc: int
    deadline: int  # deadline - now, clamped at 0: 0 = expired (not registered), not yet pruned


class State(NamedTuple):
    #: the queue; the right end (index -1) is taken next (LPUSH by producers, BLMOVE RIGHT).
    queue: tuple[int, ...]
    #: the non-empty in-flight lists, sorted by key; each list's right end is its oldest task.
    #: (An empty list is not stored: Redis deletes an empty list, and appending to it recreates it.)
    lists: tuple[tuple[ListKey, tuple[int, ...]], ...]
    #: processing records, per task: the in-flight list it names, or None
    records: tuple[ListKey | None, ...]
    #: commits per task (more than 1 is a violation)
    committed: tuple[int, ...]
    #: server registry, per server id
    registry: tuple[Registration | None, ...]
    #: processes per server id (more than one only when an old one is stalled or superseded)
    processes: tuple[tuple[Process, ...], ...]
    #: faults injected so far (bounded by ``Bounds.faults``)
    faults: int
    #: whether a live server ever looked dead: a stall, or a Redis wipe (which forgets every
    #: registration until the next heartbeat).  The stronger no-double-execution property
    #: assumes neither happened.
    stalled_ever: bool
    #: the registry of in-flight lists (sorted): what recovery can find.  A list that holds a task
    #: and is not in it is stranded once its owner dies (``invariants.registered_custody``).
    registered: tuple[ListKey, ...] = ()
    #: per task, ``ENQUEUED``, ``WAITING`` or ``WIPED``: ghost records kept outside Redis, so
    #: that a task Redis itself lost is counted apart and never as the protocol's loss.
    status: tuple[int, ...] = ()
    #: per task, how many times recovery took it back from a holder's list (kept in Redis beside
    #: the task, incremented in the step that recovers it, deleted when it commits)
    recoveries: tuple[int, ...] = ()
    #: per task, how many times a worker started executing it (a ghost, outside Redis: a record
    #: starts the handler); tracked only with ``Bounds.max_recoveries``
    executions: tuple[int, ...] = ()
    #: the suspects list: tasks recovery took back from a dead holder and did not dead-letter.
    #: A suspect is taken (``take_suspect``) only by a process that holds no other suspect, so it
    #: never dies again beside another counted task.  Recovered tasks are pushed on the left;
    #: the right end (index -1) is taken next (first in, first out).
    suspects: tuple[int, ...] = ()
    #: the scheduled set (``P:{Q}:scheduled``, a sorted set scored by due time): delayed retries
    #: of failed handlers, waiting to be promoted to the queue.  Kept sorted by task: the due
    #: times are abstracted away (time only delays a promotion), so any member may come due first,
    #: and a member is there at most once (ZADD of a member already there only moves its score).
    scheduled: tuple[int, ...] = ()
    #: only with ``Bounds.registration_ages``: the registered lists whose last registration (ZADD,
    #: score = now) was since the clock last advanced, i.e. younger than the registry's grace
    #: (one tick there).  The garbage collection spares them.  Always () without the flag.
    fresh: tuple[ListKey, ...] = ()


class Bounds(NamedTuple):
    tasks: int = 3
    servers: int = 2
    workers: int = 2
    faults: int = 2
    #: at most this many processes per server id at once (an old stalled one and its successor)
    processes_per_server: int = 2
    #: drains move one task per step (so appenders and takers interleave with a drain) instead
    #: of draining a whole pass in one step.  None: per step only where it matters, i.e. for a
    #: variant whose drain is unbounded (see ``protocol.drains_in_steps``).
    drain_steps: bool | None = None
    #: the last ``late_tasks`` tasks are not enqueued at the start: the ``enqueue`` action pushes
    #: them, one at a time, at any moment (so work arrives after a Redis wipe, or while a take is
    #: pending on an empty queue).
    late_tasks: int = 0
    #: Redis's own faults: ``redis_wipe`` (Redis restarts empty) is among the faults.
    redis_faults: bool = False
    #: the assumption the registry's garbage collection rests on: a take's BLMOVE is served or
    #: times out within ``registry_grace`` of the registration sent in the same pipeline (Redis
    #: enforces the block timeout; the grace exceeds it).  False: a take can stay pending past the
    #: grace, so a collection can remove the list before the take fills it.
    take_wait_bounded: bool = True
    #: poison-pill detection: a task recovered more than this many times is dead-lettered in the
    #: recovering step.  None: recoveries are not counted (the state space of the other bounds).
    max_recoveries: int | None = None
    #: a handler may fail (each failure counts against ``faults``): the release's retry branch
    #: then schedules the task in the scheduled set (a delayed retry), and ``promote`` moves it to
    #: the queue once it is due.  False: handlers always succeed (the other bounds' state space).
    handler_failures: bool = False
    #: asyncio's fault: a worker step is cancelled at an await before its command is sent
    #: (``cancel_before_send``, each counts against ``faults``): nothing moves in Redis, and the
    #: worker, which cannot tell a cancellation before the send from one after it, is dirty.
    #: False: no such fault (the other bounds' state space); ``taskcustody verify --async`` turns
    #: it on for its model check and its stateful run.
    cancels_before_send: bool = False
    #: registrations have an age (``State.fresh``), the registry's grace being one tick: a
    #: registration is fresh when made and old once the clock advances; the garbage collection
    #: forgets only old ones (what the implementation checks: the registration's score against
    #: now - grace).  With ``take_wait_bounded`` a tick also ends every pending take (``ARMED``):
    #: Redis served it before, or timed it out, and the production loop sends it again (``arm``,
    #: which registers the list again).  False: the abstraction of the other bounds, in which a
    #: pending take itself spares its list (``protocol.collectable``).  The loop-driven stateful
    #: run turns it on (its harness's grace is one tick), so that Redis and the model agree on
    #: which registrations the collection may forget.
    registration_ages: bool = False


def list_of(state: State, key: ListKey) -> tuple[int, ...]:
    """The tasks in the in-flight list ``key``, left end first (() when it is empty)."""
    for k, tasks in state.lists:
        if k == key:
            return tasks
    return ()


def with_list(
    lists: tuple[tuple[ListKey, tuple[int, ...]], ...], key: ListKey, tasks: tuple[int, ...]
) -> tuple[tuple[ListKey, tuple[int, ...]], ...]:
    """``lists`` with ``key`` set to ``tasks`` (removed when empty), kept sorted."""
    rest = [(k, t) for k, t in lists if k != key]
    if tasks:
        rest.append((key, tasks))
        rest.sort()
    return tuple(rest)


def initial_state(bounds: Bounds) -> State:
    """All tasks but the late ones enqueued (enqueue order only permutes task names), every server
    claimed as incarnation 0 (which registered its workers' lists), registered, its startup
    drain done (there was nothing to drain) and its workers idle."""
    workers = tuple(Worker(IDLE) for _ in range(bounds.workers))
    early = bounds.tasks - bounds.late_tasks
    registered = tuple((s, 0, w) for s in range(bounds.servers) for w in range(bounds.workers))
    return State(
        # LPUSH 0, then 1, then 2: task 0 sits at the right end and is taken first.
        queue=tuple(reversed(range(early))),
        lists=(),
        records=(None,) * bounds.tasks,
        committed=(0,) * bounds.tasks,
        registry=tuple(Registration(0, TTL) for _ in range(bounds.servers)),
        processes=tuple((Process(0, False, RUNNING, (), workers),) for _ in range(bounds.servers)),
        faults=0,
        stalled_ever=False,
        registered=registered,
        status=(ENQUEUED,) * early + (WAITING,) * bounds.late_tasks,
        recoveries=(0,) * bounds.tasks,
        executions=(0,) * bounds.tasks,
        # (the claims registered the lists just now)
        fresh=registered if bounds.registration_ages else (),
    )


# --- a faster ``_replace`` -----------------------------------------------------------------------
# ``NamedTuple._replace`` pops every field name from a keyword dict and goes through ``_make``:
# over a tenth of the checker's time was spent there (cProfile at the CI bound).  The same
# method, generated per class with one keyword per field, builds the tuple in one expression.
# Same signature for callers (keywords only), same result; an unknown field name is a TypeError
# instead of a ValueError.
_KEEP = object()


def _fast_replace(cls: type) -> None:
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    params = ", ".join(f"{f}=_KEEP" for f in fields)
    values = ", ".join(f"self[{i}] if {f} is _KEEP else {f}" for i, f in enumerate(fields))
    namespace = {"_KEEP": _KEEP, "_new": tuple.__new__, "_cls": cls}
    exec(f"def _replace(self, /, *, {params}):\n    return _new(_cls, ({values},))\n", namespace)
    cls._replace = namespace["_replace"]  # type: ignore[attr-defined]


for _cls in (Worker, Drain, Process, Registration, State):
    _fast_replace(_cls)
