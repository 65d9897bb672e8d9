"""A counterexample in words: where every task is, what each step did and which fault came with
it, how Redis differs from the model, and why the broken property matters.

One job: turn states, steps and check failures into sentences. `report.py` lays them out (the
terminal and the HTML page); nothing here formats for either.

Names. A list is named as in Redis without the queue's prefix, with the model's numbering of
incarnations (the harness renames Redis's, see `harness`): ``inflight:s0:1:w0`` is worker 0's list
of server id s0's incarnation 1, and ``worker s0:1:w0`` is that worker.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from taskcustody_model.checker import Trace
from taskcustody_model.invariants import WHY
from taskcustody_model.protocol import Action
from taskcustody_model.state import (
    HOLDING,
    PHASE_NAMES,
    PROCESS_PHASE_NAMES,
    RECORDED,
    TAKEN,
    TASK_STATUS_NAMES,
    WAITING,
    WIPED,
    ListKey,
    State,
)
from taskcustody_model.trace import describe_action

from .harness import StepRecord

# -- names ----------------------------------------------------------------------------------------


def list_name(key: ListKey) -> str:
    return f"inflight:s{key[0]}:{key[1]}:w{key[2]}"


def worker_name(s: int, inc: int, w: int) -> str:
    return f"worker s{s}:{inc}:w{w}"


def _and(parts: list[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _times(n: int) -> str:
    return {1: "", 2: " twice"}.get(n, f" {n} times")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# -- where a task is ------------------------------------------------------------------------------

_HOLDING_WORDS = {TAKEN: "taken, not recorded yet", RECORDED: "recorded, its handler runs"}


def places(state: State, t: int, order: bool = True) -> list[str]:
    """The places in Redis that hold task `t` (a place twice is said so): the queue (with its
    turn, if `order`), the suspects list, the scheduled set and the in-flight lists."""
    out = []
    in_queue = [len(state.queue) - i for i, x in enumerate(state.queue) if x == t]
    if in_queue:
        turns = _and([_ordinal(n) for n in sorted(in_queue)])
        out.append(
            f"in the queue{_times(len(in_queue))}" + (f" ({turns} to be taken)" if order else "")
        )
    for name, where in (
        ("the suspects list", state.suspects),
        ("the scheduled set", state.scheduled),
    ):
        if t in where:
            out.append(f"in {name}{_times(where.count(t))}")
    for key, tasks in state.lists:
        if t in tasks:
            unregistered = (
                ""
                if key in state.registered
                else " (a list missing from the registry of in-flight lists)"
            )
            out.append(f"in {list_name(key)}{_times(tasks.count(t))}{unregistered}")
    return out


def holders(state: State, t: int) -> list[str]:
    """The workers that hold task `t` in memory (they took it and have not released it)."""
    return [
        f"{worker_name(s, proc.inc, w)} holds it ({_HOLDING_WORDS.get(wk.phase, '')})"
        for s, procs in enumerate(state.processes)
        for proc in procs
        for w, wk in enumerate(proc.workers)
        if wk.phase in HOLDING and wk.task == t
    ]


def _outside_holders(state: State, t: int) -> list[str]:
    """The workers that hold task `t` while Redis has it somewhere other than their own lists
    (a queue, a set, or another worker's list): someone else can take it and run it too."""
    held = [
        (s, proc.inc, w)
        for s, procs in enumerate(state.processes)
        for proc in procs
        for w, wk in enumerate(proc.workers)
        if wk.phase in HOLDING and wk.task == t
    ]
    other = (
        t in state.queue
        or t in state.suspects
        or t in state.scheduled
        or any(t in tasks for key, tasks in state.lists if key not in held)
    )
    return [worker_name(*k) for k in held] if other else []


def _redis_count(state: State, t: int) -> int:
    return (
        state.queue.count(t)
        + state.suspects.count(t)
        + state.scheduled.count(t)
        + sum(tasks.count(t) for _, tasks in state.lists)
    )


def task_line(state: State, t: int) -> str:
    """Where task `t` is, e.g. ``task 1: in the queue (1st to be taken) and in
    inflight:s0:1:w0``."""
    head, more = _task_parts(state, t)
    return f"task {t}: " + "; ".join([head, *more])


def _task_parts(state: State, t: int, order: bool = True) -> tuple[str, list[str]]:
    """Task `t`'s places in Redis (or why it has none), then the rest: commits, its processing
    record, the workers holding it, its recoveries."""
    where = places(state, t, order)
    status = state.status[t] if state.status else 0
    committed = state.committed[t]
    if status == WAITING:
        head = "not enqueued yet"
    elif where:
        head = _and(where)
    elif committed:
        head = "in no queue or list"
    elif status == WIPED:
        head = "lost by Redis itself in a wipe (not the protocol's loss)"
    elif status != 0:
        head = f"in no queue or list ({TASK_STATUS_NAMES[status]})"
    else:
        head = "in no queue or list, and not committed"
    more = []
    if committed:
        more.append(f"committed{_times(committed) or ' once'}")
    record = state.records[t]
    if record is not None:
        more.append(f"its processing record names {list_name(record)}")
    held = holders(state, t)
    more += held
    if held and not where and not committed:
        more.append("in that worker's memory only")
    if state.recoveries and state.recoveries[t]:
        more.append(f"recovered{_times(state.recoveries[t]) or ' once'} from a dead holder")
    return head, more


def server_lines(state: State) -> list[str]:
    """Each server id: its registration and its processes, with what each worker does."""
    out = []
    for s, procs in enumerate(state.processes):
        reg = state.registry[s]
        if reg is None:
            regs = "not registered"
        elif reg.deadline == 0:
            regs = f"registered as incarnation {reg.inc}, expired (looks dead)"
        else:
            regs = f"registered as incarnation {reg.inc}, deadline in {reg.deadline} tick" + (
                "s" if reg.deadline != 1 else ""
            )
        ps = []
        for proc in procs:
            workers = ", ".join(
                f"w{w} "
                + (f"holds task {wk.task}" if wk.phase in HOLDING else PHASE_NAMES[wk.phase])
                for w, wk in enumerate(proc.workers)
            )
            flags = PROCESS_PHASE_NAMES[proc.phase] + (", stalled" if proc.stalled else "")
            drains = "".join(
                f"; draining {list_name(d.key)} ({d.moved} of {d.length} moved)"
                for d in proc.drains
            )
            ps.append(f"incarnation {proc.inc} {flags} ({workers}){drains}")
        out.append(f"server s{s}: {regs}; " + ("; ".join(ps) if ps else "no process running"))
    return out


def describe(state: State) -> list[str]:
    """The state in words: one line per task, then one per server id."""
    lines = [task_line(state, t) for t in range(len(state.committed))]
    lines += server_lines(state)
    if state.faults:
        lines.append(f"faults so far: {state.faults}")
    return lines


# -- how Redis differs from the model -------------------------------------------------------------


def difference(model: State, real: State) -> list[str]:
    """How the state read from Redis differs from the model's, task by task and server by
    server, with what each difference means; [] if they agree."""
    out = []
    for t in range(len(model.committed)):
        # (a task's turn in the queue moves when another task is added or missing: the order
        # is compared apart, below)
        m, r = _task_parts(model, t, order=False), _task_parts(real, t, order=False)
        if m == r:
            continue
        # the places alone when they differ (the rest is in both states, printed beside)
        m_text, r_text = (
            (m[0], r[0]) if m[0] != r[0] else ("; ".join([m[0], *m[1]]), "; ".join([r[0], *r[1]]))
        )
        out.append(f"task {t}: the model has it {m_text}; Redis has it {r_text}")
        mc, rc = _redis_count(model, t), _redis_count(real, t)
        elsewhere = _outside_holders(real, t)
        if rc > 1 and rc > mc:
            out.append(
                f"  that is a duplicate: Redis holds task {t} in {rc} places where the "
                f"model has {mc}, so it will run twice"
            )
        elif elsewhere and mc <= 1:
            out.append(
                f"  that is a duplicate: {elsewhere[0]} still holds task {t}, and Redis "
                f"also offers it to other workers, so it will run twice"
            )
        elif rc == 0 < mc and not real.committed[t]:
            out.append(
                f"  that is a loss: Redis keeps task {t} in no queue or list, and it has "
                "not committed; the model still keeps it"
            )
        elif real.committed[t] > model.committed[t]:
            out.append(f"  Redis has committed task {t} more often than the model allows")
    common = set(model.queue) & set(real.queue)
    if [x for x in model.queue if x in common] != [x for x in real.queue if x in common]:
        out.append(
            f"the queue's order (next to be taken on the right): the model has "
            f"{list(model.queue)}; Redis has {list(real.queue)}"
        )
    for ms, rs in zip(server_lines(model), server_lines(real), strict=True):
        if ms != rs:
            name, _, m_body = ms.partition(": ")
            out.append(f"{name}: the model has it {m_body}; Redis has it {rs.partition(': ')[2]}")
    if model.registered != real.registered:
        out.append(
            "registry of in-flight lists: the model has "
            f"{_list_names(model.registered)}; Redis has {_list_names(real.registered)}"
        )
    if not out and model != real:  # a field the words above do not cover
        out += [
            f"{name}: the model has {getattr(model, name)!r}; Redis has {getattr(real, name)!r}"
            for name in State._fields
            if getattr(model, name) != getattr(real, name)
        ]
    return out


def _list_names(keys: Iterable[ListKey]) -> str:
    return ", ".join(list_name(k) for k in keys) or "none"


# -- faults ---------------------------------------------------------------------------------------


def fault_kind(action: Action) -> str:
    """The fault's kind, as the run's totals count them (`Harness.counts`)."""
    return f"dropped-reply:{action.command}" if action.name == "dropped_reply" else action.name


def fault_of(action: Action) -> str:
    """The fault that came with a step, in words; "" if none did."""
    if not action.is_fault:
        return ""
    if action.name == "dropped_reply":
        return (
            f"the reply to {action.command} was lost: Redis ran the command, the caller "
            "never saw its answer"
        )
    if action.name == "cancel_before_send":
        return (
            f"the worker's {action.command} was cancelled before its command was sent: "
            "Redis ran nothing, and the worker cannot tell that from a lost reply"
        )
    return {
        "crash_worker": "the worker crashed between two commands (no clean-up ran)",
        "crash_server": "the server process crashed, and all its workers with it",
        "stall_server": (
            "the process stalled: it stops heartbeating and sweeping while its "
            "workers go on, so it looks dead to the others"
        ),
        "redis_wipe": "Redis restarted empty (every key of the queue lost)",
        "retry": "the handler failed; its release scheduled a retry",
    }.get(action.name, action.name)


def faults_by_kind(actions: Iterable[Action]) -> dict[str, int]:
    """The faults of one counterexample's steps, by kind (not the run's totals)."""
    return dict(sorted(Counter(fault_kind(a) for a in actions if a.is_fault).items()))


# -- the steps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a counterexample, in words."""

    index: int
    text: str  # who did what
    fault: str  # the fault that came with it, or ""
    model: list[str] | None  # the state after it, the model's (None: not read back)
    real: list[str] | None  # ... as read from Redis (None: not read back, or a model trace)
    difference: list[str] = field(default_factory=list)
    recovery: bool = False  # run by the recovery at the end of an example, after faults stopped


#: Said before the first recovery step of a stateful example.
RECOVERY_STARTS = (
    "faults stop here: from now on the protocol's own steps run (recovery) until "
    "every task has committed"
)


def from_records(steps: list[StepRecord]) -> list[Step]:
    """The stateful run's steps, with the states its checks saw after them."""
    out = []
    for s in steps:
        model = describe(s.model) if s.model is not None else None
        real = describe(s.real) if s.real is not None else None
        diff = difference(s.model, s.real) if s.model is not None and s.real is not None else []
        out.append(Step(s.index, s.text, fault_of(s.action), model, real, diff, s.recovery))
    return out


def from_trace(trace: Trace) -> list[Step]:
    """The model checker's steps, each with the model's state after it."""
    out = []
    before = trace.initial
    for n, step in enumerate(trace.steps, 1):
        out.append(
            Step(
                n,
                describe_action(step.action, before),
                fault_of(step.action),
                describe(step.state),
                None,
            )
        )
        before = step.state
    return out


# -- the property that broke ----------------------------------------------------------------------

#: The stateful run's own checks, which are not properties of the model: why each matters.
HARNESS_WHY = {
    "conformance": (
        "After every step Redis must hold exactly the state the model predicts: a difference "
        "means the implementation did something the protocol does not allow, or skipped "
        "something it requires."
    ),
    "eventual": WHY["eventual-recovery"],
    "fault": (
        "A reply the run dropped must surface as an error in the caller, as the model assumes; "
        "otherwise the fault was not the one the model explored."
    ),
}
_MAPPING_WHY = (
    "Redis's state must map onto the model's terms (known incarnations, whole ticks, "
    "a commit log that matches the commit counter): otherwise it cannot be checked."
)


_MODEL_LIST = re.compile(r"\binflight:(\d+):(\d+):(\d+)\b")


def in_our_names(text: str) -> str:
    """A model message with its list names as these sentences give them (the model says
    ``inflight:0:1:0`` for ``inflight:s0:1:w0``)."""
    return _MODEL_LIST.sub(lambda m: list_name((int(m[1]), int(m[2]), int(m[3]))), text)


@dataclass(frozen=True)
class Broken:
    """The property that broke: its name, on which side, what the check said, and why it
    matters."""

    property: str
    side: str
    message: list[str]
    why: str


def broken(kind: str, message: str, last: Step | None = None) -> Broken:
    """`kind` and `message` as the check raised them (`harness.Mismatch`, or a model checker's
    violation); `last`, the failing step in words, says a conformance failure task by task (if
    its check read Redis back) and whether it broke during recovery."""
    side, _, name = kind.rpartition(":") if kind.startswith(("model:", "real:")) else ("", "", kind)
    sides = {
        "model": "in the model's state",
        "real": "in the state read from Redis",
        "": "Redis against the model" if name == "conformance" else "",
    }
    text = [in_our_names(message)]
    if name == "conformance" and last is not None and last.difference:
        text = list(last.difference)
    why = WHY.get(name) or HARNESS_WHY.get(name)
    if why is None:
        why = (
            _MAPPING_WHY
            if name in ("commits", "registry", "mapping", "clock")
            else (
                "The implementation's step failed, or did what the model does not predict for it."
            )
        )
    where = sides.get(side, "")
    if last is not None and last.recovery:
        where = ", ".join(x for x in (where, "during recovery, after faults stopped") if x)
    return Broken(name, where, text, why)
