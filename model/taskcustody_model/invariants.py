"""The properties of ``docs/protocol.md`` (section 6) as plain functions.

Safety properties are functions of one state (or, for the promptness of recovery, of one step)
returning a violation message or ``None``.  The eventual property is ``is_done`` (a quiescent state
where recovery has finished); the checker asks whether every reachable state can still reach one
once faults stop.
"""

from __future__ import annotations

from collections.abc import Callable

from .protocol import Action, Config, is_dead, is_live, pass_selection
from .state import CLAIMED, ENQUEUED, HOLDING, POISONED, WAITING, State

Violation = tuple[str, str]  # (property name, message)


def _places(state: State, config: Config) -> list[int]:
    """How many places hold each task: the queue, the suspects list, the scheduled set and the
    in-flight lists (and,
    in the BLPOP design, a worker's memory: that design has no list to hold a task in transit)."""
    count = [0] * len(state.committed)
    for t in (*state.queue, *state.suspects, *state.scheduled):
        count[t] += 1
    for _, tasks in state.lists:
        for t in tasks:
            count[t] += 1
    if not config.variant.take_into_list:
        for t in _in_hands(state):
            count[t] += 1
    return count


def _in_hands(state: State) -> list[int]:
    return [
        w.task
        for procs in state.processes
        for proc in procs
        for w in proc.workers
        if w.phase in HOLDING
    ]


def _ours(state: State, t: int) -> bool:
    """Whether task ``t`` is the protocol's to keep: enqueued, and not lost by Redis itself
    (a task enqueued before a wipe that had not committed is Redis's loss, counted apart)."""
    return not state.status or state.status[t] == ENQUEUED


def _poisoned(state: State, t: int) -> bool:
    return bool(state.status) and state.status[t] == POISONED


def no_loss(state: State, config: Config) -> str | None:
    """Every enqueued task that has not committed is somewhere recoverable."""
    count = _places(state, config)
    if config.variant.take_into_list and not config.variant.composite_takes_into_list:
        # Design 14: its composite holds the task it pops in the worker's hands only, as the
        # BLPOP design does every task; as there, a task in a live worker's hands is not lost yet
        # (its lost reply is: the task then exists nowhere).  Not a place for no-duplication: a
        # task the worker took into its list is in its hands too.
        for t in _in_hands(state):
            count[t] += 1
    for t, commits in enumerate(state.committed):
        if commits == 0 and count[t] == 0 and _ours(state, t) and not _poisoned(state, t):
            if not config.variant.take_into_list and state.records[t] is not None:
                continue  # BLPOP design: the processing record is its (only) recovery path
            return (
                f"task {t} is lost: not committed, not in the queue, the suspects list, the "
                "scheduled set or any in-flight list"
            )
    return None


def no_duplication(state: State, config: Config) -> str | None:
    """No task id appears twice across the queue and the in-flight lists, and a committed task
    appears nowhere (it would run again)."""
    count = _places(state, config)
    for t, commits in enumerate(state.committed):
        if count[t] > 1:
            return f"task {t} is in {count[t]} places at once"
        if commits and count[t]:
            return f"task {t} has committed but is still queued or in custody"
        if state.status and state.status[t] == POISONED and (count[t] or commits):
            return (
                f"task {t} was dead-lettered as a poison pill but is still queued, in "
                "custody or committed"
            )
    return None


def no_double_commit(state: State, config: Config) -> str | None:
    for t, commits in enumerate(state.committed):
        if commits > 1:
            return f"task {t} committed {commits} times"
    return None


def no_double_execution(state: State, config: Config) -> str | None:
    """Without stalls, no two live workers hold (execute) the same task at the same time."""
    if state.stalled_ever:
        return None  # with a stall only custody and commits are exclusive (checked above)
    held = _in_hands(state)
    for t in set(held):
        if held.count(t) > 1:
            return f"task {t} is held by {held.count(t)} live workers at once (no stall happened)"
    return None


def bounded_executions(state: State, config: Config) -> str | None:
    """With poison-pill detection, no task starts executing more than ``max_recoveries + 1``
    times (the model's handler succeeds at its first attempt: ``max_attempts`` is 1 here).  Every
    execution needs a take, every take after the first needs the task back in the queue, and the
    only way back is a counted recovery; the one past the limit dead-letters the task instead."""
    limit = config.bounds.max_recoveries
    if limit is None:
        return None
    for t, n in enumerate(state.executions):
        if n > limit + 1:
            return (
                f"task {t} started executing {n} times; max_recoveries={limit} allows {limit + 1}"
            )
    return None


def suspects_run_alone(state: State, config: Config) -> str | None:
    """No process (server id, incarnation) holds, across all its in-flight lists, more than one
    task whose recovery count is >= 1.  So a task that dies again after its first recovery dies
    as the only counted task of its process: a task that shared a poison pill's death gains one
    count from it, never another from the same pill, and loses it when it commits."""
    if config.bounds.max_recoveries is None:
        return None
    counted: dict[tuple[int, int], list[int]] = {}
    for key, tasks in state.lists:
        for t in tasks:
            if state.recoveries[t] >= 1:
                counted.setdefault(key[:2], []).append(t)
    for (s, inc), held in counted.items():
        if len(held) > 1:
            return (
                f"server {s} incarnation {inc} holds {len(held)} recovered tasks at once "
                f"({', '.join(map(str, sorted(held)))}): a death of that process counts all "
                "of them"
            )
    return None


def registered_custody(state: State, config: Config) -> str | None:
    """Every in-flight list that holds a task is in the registry: recovery finds lists only
    there, so a task in an unregistered list is stranded once its holder dies."""
    for key, tasks in state.lists:
        if key not in state.registered:
            return (
                f"task {tasks[-1]} is in {_key(key)}, which is not in the registry of in-flight "
                "lists: no recovery can find it"
            )
    return None


def bounded_work(state: State, config: Config) -> str | None:
    for procs in state.processes:
        for proc in procs:
            for d in proc.drains:
                if d.moved > d.length:
                    return (
                        f"a drain of {_key(d.key)} made {d.moved} moves; "
                        f"the list held {d.length} when it started"
                    )
    return None


INVARIANTS: dict[str, Callable[[State, Config], str | None]] = {
    "no-loss": no_loss,
    "no-duplication": no_duplication,
    "no-double-commit": no_double_commit,
    "no-double-execution": no_double_execution,
    "registered-custody": registered_custody,
    "bounded-executions": bounded_executions,
    "suspects-run-alone": suspects_run_alone,
    "bounded-work": bounded_work,
}


#: Why each property matters, in one sentence a reader of a counterexample can check against its
#: states (reports print it beside the broken property; a test keeps one per property).
WHY: dict[str, str] = {
    "no-loss": (
        "Every enqueued task that has not committed must be somewhere recovery can find it (the "
        "queue, the suspects list, the scheduled set or an in-flight list): a task in none of "
        "them, held at most in a worker's memory, is gone for good once that worker dies."
    ),
    "no-duplication": (
        "A task must be in at most one place at a time, and nowhere once it has committed: a "
        "task in two places, or queued after its commit, will be run twice."
    ),
    "no-double-commit": (
        "A task must commit once: a second commit means its handler ran to completion twice and "
        "its effects happened twice."
    ),
    "no-double-execution": (
        "Unless some process stalled (and so looked dead to the others), no two live workers may "
        "hold the same task: while the deployment is healthy, execution is exclusive."
    ),
    "registered-custody": (
        "Every in-flight list that holds a task must be in the registry of in-flight lists, "
        "because recovery finds lists only there: a task in an unregistered list is stranded "
        "when its holder dies."
    ),
    "bounded-executions": (
        "With poison-pill detection a task may start at most max_recoveries + 1 times: more "
        "means a task that keeps killing its workers is never dead-lettered."
    ),
    "suspects-run-alone": (
        "A process may hold at most one recovered (suspect) task at a time, so that when a poison "
        "pill kills it only the pill's count grows and no innocent task is dead-lettered with it."
    ),
    "bounded-work": (
        "A drain must stop after as many moves as its list held when it started: one that goes "
        "on while the list's live owner refills it never ends, and steals that owner's tasks."
    ),
    "prompt-recovery": (
        "A sweep pass must drain every list that is dead when it starts, and a startup drain "
        "every list of its server id's earlier incarnations: a list left behind keeps a dead "
        "holder's tasks from every worker for as long as nothing else recovers them."
    ),
    "eventual-recovery": (
        "Once faults stop, the protocol's own steps must bring every task to exactly one commit "
        "with nothing left in the queue, the lists or the records: from a state where no "
        "sequence of steps gets there, some task is stranded forever."
    ),
}


def check_invariants(state: State, config: Config) -> Violation | None:
    for name, inv in INVARIANTS.items():
        msg = inv(state, config)
        if msg is not None:
            return name, msg
    return None


def prompt_recovery(before: State, action: Action, config: Config) -> str | None:
    """Recovery completes in the pass that starts it: a sweep pass selects every list that is
    dead when it starts (except our own incarnation's); a startup drain selects every list of our
    server id from an earlier incarnation, before any of our workers takes work."""
    if action.name not in ("sweep", "startup_drain"):
        return None
    s, i = action.server, action.proc
    proc = before.processes[s][i]
    selected = pass_selection(before, action, config)
    for key, _tasks in before.lists:
        if action.name == "sweep":
            owed = key[:2] != (s, proc.inc) and is_dead(before.registry, key)
        else:
            owed = before.processes[s][i].phase == CLAIMED and key[0] == s and key[1] != proc.inc
        if owed and key not in selected:
            what = "sweep pass" if action.name == "sweep" else "startup drain"
            return f"the {what} leaves dead list {_key(key)} undrained"
    return None


def check_transition(before: State, action: Action, config: Config) -> Violation | None:
    """Properties of one step (``action`` taken in ``before``)."""
    if action.name in ("sweep", "startup_drain"):  # a dropped sweep reply abandons the pass
        msg = prompt_recovery(before, action, config)
        if msg is not None:
            return "prompt-recovery", msg
    return None


def is_done(state: State) -> bool:
    """Recovery has finished: every task enqueued (and not lost by Redis itself) committed
    exactly once; queue, in-flight lists and processing records empty; the server registry lists
    only live servers, and the registry of in-flight lists only live servers' lists."""
    if state.queue or state.suspects or state.scheduled or state.lists or WAITING in state.status:
        return False
    if any(
        c != (1 if _ours(state, t) and not _poisoned(state, t) else 0)
        for t, c in enumerate(state.committed)
    ):
        return False
    if any(r is not None for r in state.records):
        return False
    if any(not is_live(state.registry, k) for k in state.registered):
        return False
    for s, reg in enumerate(state.registry):
        if reg is not None and (
            reg.deadline == 0 or all(p.inc != reg.inc for p in state.processes[s])
        ):
            return False
    return True


def _key(key: tuple[int, int, int]) -> str:
    return f"inflight:{key[0]}:{key[1]}:{key[2]}"
