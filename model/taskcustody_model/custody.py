"""The Redis side the steps share: liveness, the registries, moving tasks, the worker's scripts.

Each function here is one piece of a step's effect (a Lua script's body, a ``ZADD``, a drain's
``LMOVE``s), written once because more than one step runs it: the take's script serves ``take``
and the composite ``release_and_take``, the recovery count serves every drain and the processing
sweep.  Nothing here decides *when* anything happens (that is the guards', in the step modules).
"""

from __future__ import annotations

from .action import Config
from .state import (
    ARMED,
    CRASHED,
    HOLDING,
    IDLE,
    NO_TASK,
    POISONED,
    STOPPED,
    SUPERSEDED,
    ListKey,
    Process,
    Registration,
    State,
    Worker,
    list_of,
    with_list,
)

# --- liveness, as recovery sees it ------------------------------------------------------------


def is_live(registry: tuple[Registration | None, ...], key: ListKey) -> bool:
    """A list is live iff its server is in the registry *as that incarnation*.

    Liveness as recovery sees it is registry membership: right after a prune, membership is
    exactly "deadline > now".  Between passes an expired server still looks live until the next
    prune, which is why the sweep must prune *before* it drains (variant 7).
    """
    reg = registry[key[0]]
    return reg is not None and reg.inc == key[1]


def is_dead(registry: tuple[Registration | None, ...], key: ListKey) -> bool:
    """Dead by the clock: its server is not registered with that incarnation and deadline > now."""
    reg = registry[key[0]]
    return reg is None or reg.inc != key[1] or reg.deadline == 0


def prune(registry: tuple[Registration | None, ...]) -> tuple[Registration | None, ...]:
    """``prune_inactive_servers``: drop every server whose deadline <= now."""
    return tuple(None if r is None or r.deadline == 0 else r for r in registry)


def renewed(state: State, s: int, inc: int) -> bool:
    """Whether a healthy process (running, not stalled, not superseded) holds this registration.

    A healthy server heartbeats much more often than the TTL, so its registration never lapses:
    the model folds those renewals into ``advance_clock`` (a renewal's timing within a tick is
    unobservable: only "deadline > now" is ever compared).  The ``heartbeat`` action is kept for
    the heartbeats that *do* something: re-registering after a stall, discovering a supersession.
    """
    return any(p.inc == inc and not p.stalled and p.phase != SUPERSEDED for p in state.processes[s])


def fresh_incarnation(state: State, server: int) -> int:
    """INCR counter.  Only equality of incarnations matters, so the smallest number that nothing
    in the state mentions any more is as fresh as a counter's next value (and keeps the state
    space finite)."""
    used = set()
    reg = state.registry[server]
    if reg is not None:
        used.add(reg.inc)
    for p in state.processes:
        for proc in p:
            used.update(d.key[1] for d in proc.drains if d.key[0] == server)
    used.update(proc.inc for proc in state.processes[server])
    used.update(k[1] for k, _ in state.lists if k[0] == server)
    used.update(k[1] for k in state.records if k is not None and k[0] == server)
    used.update(k[1] for k in state.registered if k[0] == server)
    inc = 0
    while inc in used:
        inc += 1
    return inc


# --- editing a state ------------------------------------------------------------------------


def set_at(t: tuple, i: int, value: object) -> tuple:  # type: ignore[type-arg]
    return (*t[:i], value, *t[i + 1 :])


def with_process(state: State, s: int, i: int, proc: Process | None) -> State:
    """``state`` with process ``i`` of server ``s`` replaced by ``proc`` (removed when None)."""
    procs = state.processes[s]
    new = procs[:i] + ((proc,) if proc is not None else ()) + procs[i + 1 :]
    return state._replace(processes=set_at(state.processes, s, new))


def with_worker(state: State, s: int, i: int, w: int, worker: Worker) -> State:
    proc = state.processes[s][i]
    return with_process(state, s, i, proc._replace(workers=set_at(proc.workers, w, worker)))


def registered_with(registered: tuple[ListKey, ...], *keys: ListKey) -> tuple[ListKey, ...]:
    """The registry after ``ZADD``s of ``keys`` (a sorted tuple, so equal sets compare equal)."""
    new = [k for k in keys if k not in registered]
    return tuple(sorted((*registered, *new))) if new else registered


def register(state: State, config: Config, *keys: ListKey) -> State:
    """``ZADD registry <now>`` of ``keys``: registered, and with ``Bounds.registration_ages``
    fresh (a ZADD of a list already there renews its score)."""
    state = state._replace(registered=registered_with(state.registered, *keys))
    if config.bounds.registration_ages:
        state = state._replace(fresh=registered_with(state.fresh, *keys))
    return state


# --- moving tasks: recovery's side ----------------------------------------------------------


def move_to_queue(
    state: State, key: ListKey, count: int, config: Config, by: tuple[int, int]
) -> State:
    """``count`` times ``LMOVE key queue RIGHT RIGHT``, deleting the moved tasks' processing
    records if they name this list, and counting each task's recovery (one Lua chunk of the
    drain): a task recovered once too often goes to the dead letters instead of the queue."""
    tasks = list_of(state, key)
    moved = tasks[len(tasks) - count :][::-1]  # oldest first
    records = state.records
    for t in moved:
        if records[t] == key:
            records = set_at(records, t, None)
    state = state._replace(
        lists=with_list(state.lists, key, tasks[: len(tasks) - count]), records=records
    )
    for t in moved:
        state = recovered(state, t, config, by)
    return state


def recovered(state: State, t: int, config: Config, by: tuple[int, int]) -> State:
    """Task ``t`` was just taken out of a holder's list by recovery: count it, in the same step,
    and requeue it -- or, past ``max_recoveries``, dead-letter it as a poison pill (a task that
    kills the process that runs it would otherwise walk through the whole fleet)."""
    limit = config.bounds.max_recoveries
    if limit is None or not config.variant.counts_recoveries:
        return state._replace(queue=(*state.queue, t))
    n = state.recoveries[t] + 1
    if n > limit:
        # (the count leaves the hash for the dead letter, which keeps it)
        return state._replace(
            status=set_at(state.status, t, POISONED), recoveries=set_at(state.recoveries, t, n)
        )
    if not config.variant.counts_in_recovering_step:
        # design 11: the count is written later, by the recovering process (``count_recovery``)
        s, i = by
        proc = state.processes[s][i]
        state = with_process(state, s, i, proc._replace(pending_counts=(*proc.pending_counts, t)))
        return back_to_take(state, t, config)
    state = state._replace(recoveries=set_at(state.recoveries, t, n))
    return back_to_take(state, t, config)


def back_to_take(state: State, t: int, config: Config) -> State:
    """Where a counted recovered task goes: the suspects list's far end (it runs alone, never
    again beside the tasks it died with: ``take_suspect``), or in design 12 the queue's take end,
    beside them."""
    if config.variant.suspects_run_alone:
        return state._replace(suspects=(t, *state.suspects))
    return state._replace(queue=(*state.queue, t))


def free_slot(state: State, s: int, i: int, w: int) -> State:
    """Worker ``w`` is clean again (idle: it holds nothing and its list is empty): if it held
    its process's suspect slot, the slot is free."""
    proc = state.processes[s][i]
    if proc.suspect == w and proc.workers[w].phase == IDLE:
        return with_process(state, s, i, proc._replace(suspect=-1))
    return state


def settle(state: State) -> State:
    """A superseded process exits once none of its workers holds a task."""
    if not any(
        proc.phase == SUPERSEDED and all(w.phase in (CRASHED, STOPPED) for w in proc.workers)
        for procs in state.processes
        for proc in procs
    ):
        return state
    return state._replace(
        processes=tuple(
            tuple(
                proc
                for proc in procs
                if not (
                    proc.phase == SUPERSEDED
                    and all(w.phase in (CRASHED, STOPPED) for w in proc.workers)
                )
            )
            for procs in state.processes
        )
    )


# --- the worker's scripts (shared by the steps and the composite ``release_and_take``) ---------


def take_from_queue(
    state: State, s: int, i: int, w: int, config: Config, into_list: bool
) -> tuple[State, int]:
    """The take's Redis side: the queue's next task, and the task."""
    v = config.variant
    proc = state.processes[s][i]
    t = state.queue[-1]
    state = state._replace(queue=state.queue[:-1])
    if into_list:
        # The take pipeline: ZADD registry <now> own-list (so that no task can enter a list
        # recovery does not know, even after Redis lost the registry), then BLMOVE queue
        # own-list RIGHT LEFT: taking and recording who took it is one step.  A pending take
        # (ARMED) registered when it was sent.
        key = (s, proc.inc, w)
        if v.registry_heals and proc.workers[w].phase != ARMED:
            state = register(state, config, key)
        state = state._replace(lists=with_list(state.lists, key, (t, *list_of(state, key))))
    # else BLPOP (or design 14's composite): the task leaves Redis with the reply
    return state, t


def take_suspect_script(state: State, s: int, i: int, w: int, config: Config) -> tuple[State, int]:
    """One script (TAKE_SUSPECT): ZADD registry <now> own-list, LMOVE suspects own-list RIGHT
    LEFT, HSET the processing record.  The process's suspect slot is taken before it is sent and
    is freed only once this worker is clean again (idle, its list known empty)."""
    proc = state.processes[s][i]
    t = state.suspects[-1]
    key = (s, proc.inc, w)
    state = register(state, config, key)._replace(
        suspects=state.suspects[:-1],
        lists=with_list(state.lists, key, (t, *list_of(state, key))),
        records=set_at(state.records, t, key),
    )
    return with_process(state, s, i, proc._replace(suspect=w)), t


def record_script(
    state: State, s: int, i: int, w: int, t: int, config: Config, executes: bool
) -> State:
    """One Lua step: HSET the record only if the task is still in our list.  An unconditional
    HSET is wrong: a stalled worker whose task was drained and re-taken elsewhere would overwrite
    the new holder's record with one naming its own list; once its server re-registers that list
    is live again, so no sweep ever deletes the stale record.  (Found by this checker: correct
    variant, 2 tasks, faults=2.)  With the check, a record always names the list that holds its
    task.  (BLPOP design: no list to check.)  ``executes``: the handler starts now (the model
    folds its end into the release)."""
    v = config.variant
    key = (s, state.processes[s][i].inc, w)
    if not v.take_into_list or t in list_of(state, key):
        state = state._replace(records=set_at(state.records, t, key))
    if executes and config.bounds.max_recoveries is not None:
        state = state._replace(executions=set_at(state.executions, t, state.executions[t] + 1))
    return state


def release_script(
    state: State, s: int, i: int, w: int, config: Config, retry: bool, checks_custody: bool
) -> tuple[State, bool]:
    """The release script's Redis side, for the task worker ``w`` holds: LREM own-list task 1;
    HDEL the record if it names this list; commit if (and only if) the task was still ours (or,
    ``retry``, the retry branch).  Returns the state and whether the own list still holds
    something (debris) afterwards: the script returns (held, remaining length).
    ``checks_custody=False``: design 15's composite, which commits whatever its LREM found."""
    v = config.variant
    proc = state.processes[s][i]
    t = proc.workers[w].task
    key = (s, proc.inc, w)
    tasks = list_of(state, key)
    if not v.take_into_list:
        held = True  # BLPOP design: the task is in our hands; nobody else can have it
    elif v.release_removes_custody:
        held = t in tasks
        if held:
            tasks = tuple(x for x in tasks if x != t)
            state = state._replace(lists=with_list(state.lists, key, tasks))
    else:
        held = True  # broken: no LREM, so the script cannot tell, and commits
    if not checks_custody:
        held = True
    if state.records[t] == key:
        state = state._replace(records=set_at(state.records, t, None))
    if held and retry:
        # The handler failed: the same script's retry branch ZADDs the task to the scheduled
        # set (score: the due time the worker computed, now + the jittered backoff).  It
        # keeps its recovery count.  The failed execution is bounded by max_attempts, not by
        # max_recoveries, so it does not count towards ``bounded_executions``.
        state = state._replace(scheduled=tuple(sorted({*state.scheduled, t})))
        if config.bounds.max_recoveries is not None:
            state = state._replace(executions=set_at(state.executions, t, state.executions[t] - 1))
    elif held:
        # a commit also deletes the task's recovery count: a task that completes leaves none
        state = state._replace(
            committed=set_at(state.committed, t, state.committed[t] + 1),
            recoveries=set_at(state.recoveries, t, 0),
        )
    return state, bool(tasks)


def worker_task(state: State, s: int, i: int, w: int) -> int:
    """The task a worker believes it holds, or NO_TASK."""
    worker = state.processes[s][i].workers[w]
    return worker.task if worker.phase in HOLDING else NO_TASK
