"""Render states and traces as numbered, readable steps."""

from __future__ import annotations

from .checker import CheckResult, Trace
from .protocol import Action
from .simulate import SimulationResult
from .state import HOLDING, PHASE_NAMES, PROCESS_PHASE_NAMES, TASK_STATUS_NAMES, Bounds, State


def describe_action(action: Action, before: State) -> str:
    """Who did what, e.g. ``server 0 (incarnation 1) worker 1: take``."""
    who = ""
    if action.server >= 0:
        who = f"server {action.server}"
        if action.proc >= 0:
            who += f" (incarnation {before.processes[action.server][action.proc].inc})"
        if action.worker >= 0:
            who += f" worker {action.worker}"
        who += ": "
    if action.name == "release_and_take" or action.command == "release_and_take":
        # the composite: say which task it releases (what it takes next is in the state after)
        t = before.processes[action.server][action.proc].workers[action.worker].task
        what = f"release_and_take (release task {t}, take the next, in one script)"
        if action.name == "dropped_reply":
            what += ", reply lost [fault]"
        elif action.name == "cancel_before_send":
            what += ", cancelled before it was sent [fault]"
    elif action.name == "dropped_reply":
        what = f"{action.command}, reply lost [fault]"
    elif action.name == "cancel_before_send":
        what = f"{action.command}, cancelled before it was sent [fault]"
    elif action.is_fault:
        what = f"{action.name} [fault]"
    elif action.name == "promote":
        what = f"promote task {action.task} (due) from the scheduled set"
    elif action.name == "enqueue":
        what = f"producer: enqueue task {before.status.index(1)}"
    else:
        what = action.name
    return who + what


def describe_state(state: State, indent: str = "    ") -> str:
    queue = " ".join(str(t) for t in state.queue) or "-"
    lists = (
        ", ".join(
            f"inflight:{k[0]}:{k[1]}:{k[2]}=[{' '.join(map(str, ts))}]" for k, ts in state.lists
        )
        or "-"
    )
    records = (
        ", ".join(
            f"{t}->inflight:{k[0]}:{k[1]}:{k[2]}"
            for t, k in enumerate(state.records)
            if k is not None
        )
        or "-"
    )
    committed = " ".join(f"{t}:{c}" for t, c in enumerate(state.committed))
    registered = ", ".join(f"inflight:{k[0]}:{k[1]}:{k[2]}" for k in state.registered) or "-"
    lines = [
        f"queue (next on the right): [{queue}]   committed: {committed}"
        + (f"   suspects: [{' '.join(map(str, state.suspects))}]" if state.suspects else "")
        + (f"   scheduled: {{{' '.join(map(str, state.scheduled))}}}" if state.scheduled else ""),
        f"in-flight: {lists}",
        f"registry of in-flight lists: {registered}",
        f"processing: {records}",
    ]
    apart = [f"{t}: {TASK_STATUS_NAMES[st]}" for t, st in enumerate(state.status) if st != 0]
    if apart:
        lines.append("tasks not enqueued, or lost by Redis: " + ", ".join(apart))
    for s, procs in enumerate(state.processes):
        reg = state.registry[s]
        regs = (
            "not registered"
            if reg is None
            else f"registered as incarnation {reg.inc}, "
            + ("expired" if reg.deadline == 0 else f"deadline now+{reg.deadline}")
        )
        ps = []
        for proc in procs:
            workers = ", ".join(
                PHASE_NAMES[w.phase] + (f" {w.task}" if w.phase in HOLDING else "")
                for w in proc.workers
            )
            flags = PROCESS_PHASE_NAMES[proc.phase] + (" stalled" if proc.stalled else "")
            drains = ""
            if proc.drains:
                drains = " draining " + ", ".join(
                    f"inflight:{d.key[0]}:{d.key[1]}:{d.key[2]} ({d.moved}/{d.length} moved)"
                    for d in proc.drains
                )
            ps.append(f"incarnation {proc.inc} {flags} [{workers}]{drains}")
        lines.append(f"server {s}: {regs}; " + ("; ".join(ps) if ps else "no process"))
    if state.faults:
        lines.append(f"faults so far: {state.faults}")
    return "\n".join(indent + line for line in lines)


def render_trace(trace: Trace, full_states: bool = False) -> str:
    """Numbered steps; the state after the last one (and after every one with full_states)."""
    out = [
        f"property violated: {trace.property}: {trace.message}",
        "",
        "0. initial state",
    ]
    if full_states:
        out.append(describe_state(trace.initial))
    before = trace.initial
    for n, step in enumerate(trace.steps, 1):
        out.append(f"{n}. {describe_action(step.action, before)}")
        if full_states or n == len(trace.steps):
            out.append(describe_state(step.state))
        before = step.state
    if trace.eventual:
        out.append(
            f"{len(trace.steps) + 1}. faults stop: no sequence of protocol steps from here "
            "recovers every task"
        )
    elif not trace.steps:
        out.append(describe_state(trace.initial))
    return "\n".join(out)


def describe_bounds(b: Bounds) -> str:
    """The bounds as words, e.g. ``tasks=3 servers=2 workers=2 faults=2 processes-per-server=1``
    and a word for each option that is on."""
    return (
        f"tasks={b.tasks} servers={b.servers} workers={b.workers} faults={b.faults} "
        f"processes-per-server={b.processes_per_server}"
        + (f" late-tasks={b.late_tasks}" if b.late_tasks else "")
        + (" redis-faults" if b.redis_faults else "")
        + ("" if b.take_wait_bounded else " takes-may-outwait-the-grace")
        + (" registration-ages" if b.registration_ages else "")
        + (f" max-recoveries={b.max_recoveries}" if b.max_recoveries is not None else "")
        + (" handler-failures" if b.handler_failures else "")
        + (" cancels-before-send" if b.cancels_before_send else "")
        + ("" if b.drain_steps is None else " drain-steps" if b.drain_steps else " atomic-drains")
    )


def render_bounds(bounds: Bounds, given: list[str]) -> str:
    """``model-check``'s first line: the bounds of the run, and where they come from (``given``:
    the flags that replaced some of the design's own)."""
    source = (
        f"{' '.join(given)} from the command line, the rest the design's own"
        if given
        else "the design's own; flags override"
    )
    return f"bounds: {describe_bounds(bounds)} ({source})"


def render_stats(result: CheckResult) -> str:
    """What the search explored (its bounds are ``render_bounds``'s line)."""
    return (
        f"variant {result.variant}: {result.states_generated} states generated, "
        f"{result.distinct_states} distinct states "
        f"found{' (partial-order reduced)' if result.reduced else ''}, depth {result.depth}, "
        f"{result.seconds:.1f}s "
        f"({result.states_per_second:.0f} distinct states/s)"
        + (
            f"\nhash-compacted: {result.fingerprints} fingerprints stored; the chance that two "
            f"collided (a state left unexplored) is about {result.collision_bound:.1e}"
            if result.fingerprints
            else ""
        )
    )


def render_simulation_stats(result: SimulationResult) -> str:
    return (
        f"variant {result.variant}: simulation, seed {result.seed}: "
        f"{result.walks} walks, {result.steps} steps, {result.distinct_states} distinct states "
        f"seen (not reduced by symmetry), deepest walk {result.max_depth} steps, "
        f"{result.seconds:.1f}s"
    )
