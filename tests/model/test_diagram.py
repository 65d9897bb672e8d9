"""The drawn diagram (docs/model/phases.md) is what `python -m taskcustody_model.diagram` draws
now, it names every action of the dispatch table, and the tables it is drawn from cover the
model: every move the effects make in explored state spaces is a row, and every row is made."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from taskcustody_model import diagram
from taskcustody_model.faults import WORKER_INTERRUPTIONS
from taskcustody_model.places import TASK_MOVES, place_of
from taskcustody_model.protocol import FAULTS, STEPS, Action, Config, apply, enabled_actions
from taskcustody_model.server_steps import EXIT, NO_PROCESS, PROCESS_TRANSITIONS
from taskcustody_model.state import CRASHED, STOPPED, SUPERSEDED, Bounds, State
from taskcustody_model.variants import VARIANTS, variant
from taskcustody_model.worker_steps import WORKER_TRANSITIONS

ROOT = Path(__file__).resolve().parents[2]

#: Bounds small enough to explore in seconds, which between them reach every row: per-move and
#: whole-pass drains, late tasks, a Redis wipe, poison pills and retries, cancellations,
#: registrations with ages (a pending take that a tick ends), and supersessions.
BOUNDS = (
    Bounds(
        tasks=1,
        servers=1,
        workers=1,
        faults=2,
        redis_faults=True,
        drain_steps=True,
        handler_failures=True,
        max_recoveries=1,
    ),
    Bounds(
        tasks=1,
        servers=1,
        workers=1,
        faults=2,
        handler_failures=True,
        cancels_before_send=True,
        max_recoveries=1,
    ),
    Bounds(tasks=1, servers=1, workers=1, faults=2, drain_steps=True, late_tasks=1),
    Bounds(tasks=1, servers=2, workers=1, faults=1, registration_ages=True, late_tasks=1),
    Bounds(tasks=2, servers=1, workers=2, faults=2),
)
#: states explored per design and bound (breadth first: the shortest paths to every move)
LIMIT = 1500

Move = tuple[int, str, int]


def _labels(text: str) -> set[str]:
    return {
        label.strip() for group in re.findall(r"\|([^|]+)\|", text) for label in group.split(",")
    }


def test_the_committed_diagram_is_what_the_model_draws() -> None:
    committed = (ROOT / diagram.TARGET).read_text()
    assert committed == diagram.render(), (
        f"{diagram.TARGET} is stale: run `{diagram.COMMAND}` from the repository's root"
    )


def test_the_diagram_draws_every_action_of_the_dispatch_table() -> None:
    drawn = _labels(diagram.render())
    missing = sorted(set(STEPS) - drawn)
    assert not missing, f"actions of protocol.STEPS the diagram does not draw: {missing}"
    # ... and nothing that is not an action of the model (a renamed step would linger here)
    assert drawn - set(STEPS) == {EXIT}
    # every fault but the lost reply, which is drawn as its step's own arrow
    assert FAULTS - {"dropped_reply"} <= drawn


def test_the_check_flag_fails_on_a_stale_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert diagram.main(["--check"]) == 1  # no file at all
    assert diagram.main([]) == 0
    assert diagram.main(["--check"]) == 0
    target = tmp_path / diagram.TARGET
    target.write_text(target.read_text().replace("take_suspect", "take_a_suspect", 1))
    assert diagram.main(["--check"]) == 1


def _step(action: Action) -> str:
    return action.command if action.name == "dropped_reply" else action.name


def _processes(state: State) -> dict[tuple[int, int], int]:
    return {(s, p.inc): p.phase for s, procs in enumerate(state.processes) for p in procs}


def _workers(state: State) -> dict[tuple[int, int, int], int]:
    return {
        (s, p.inc, w): wk.phase
        for s, procs in enumerate(state.processes)
        for p in procs
        for w, wk in enumerate(p.workers)
    }


def _transitions(config: Config) -> Iterator[tuple[State, Action, State]]:
    first = config.initial()
    seen = {first}
    todo = deque([first])
    explored = 0
    while todo and explored < LIMIT:
        state = todo.popleft()
        explored += 1
        for action in enabled_actions(state, config):
            after = apply(state, action, config)
            yield state, action, after
            if after not in seen:
                seen.add(after)
                todo.append(after)


def _actor(state: State, action: Action) -> tuple[int, int] | None:
    if action.proc < 0:
        return None
    return action.server, state.processes[action.server][action.proc].inc


def _worker_moves(before: State, action: Action, after: State) -> Iterator[Move]:
    """A worker's phase change, and the acting worker's step even when it keeps the phase.  A
    worker whose process exited in the step (superseded, its last worker done) was stopped in
    it, or crashed if the step crashed it."""
    step = _step(action)
    actor = _actor(before, action)
    acting = None if actor is None or action.worker < 0 else (*actor, action.worker)
    now = _workers(after)
    for key, phase in _workers(before).items():
        if key in now:
            after_phase = now[key]
        elif step == "crash_server":
            continue  # gone with its process
        elif step == "crash_worker" and key == acting:
            after_phase = CRASHED
        else:
            after_phase = phase if phase in (CRASHED, STOPPED) else STOPPED
        if after_phase != phase or key == acting:
            yield phase, step, after_phase


def _process_moves(before: State, action: Action, after: State) -> Iterator[Move]:
    """A process's phase change (a process gone: crashed, or exited once superseded), and the
    acting process's step (a worker's does not count) even when it keeps the phase."""
    step = _step(action)
    actor = _actor(before, action) if action.worker < 0 else None
    now = _processes(after)
    for key, phase in _processes(before).items():
        if key not in now and step != "crash_server":
            # exited: superseded by this very step, or it was already
            if phase != SUPERSEDED:
                yield phase, step, SUPERSEDED
            yield SUPERSEDED, EXIT, NO_PROCESS
        elif key not in now or now[key] != phase or key == actor:
            yield phase, step, now.get(key, NO_PROCESS)
    for key, phase in now.items():
        if key not in _processes(before):
            yield NO_PROCESS, step, phase


def _task_moves(before: State, action: Action, after: State) -> Iterator[tuple[str, str, str]]:
    for t in range(len(before.committed)):
        was, now = place_of(before, t), place_of(after, t)
        if was != now:
            yield was, _step(action), now


@cache
def _observed() -> tuple[set[Move], set[Move], set[tuple[str, str, str]]]:
    """Every worker and process move of every design, and every task move of the correct one,
    in the explored state spaces."""
    workers: set[Move] = set()
    processes: set[Move] = set()
    tasks: set[tuple[str, str, str]] = set()
    for bounds in BOUNDS:
        for v in VARIANTS.values():
            config = Config(bounds, v)
            for before, action, after in _transitions(config):
                workers.update(_worker_moves(before, action, after))
                processes.update(_process_moves(before, action, after))
                if v.name == "correct":
                    tasks.update(_task_moves(before, action, after))
    return workers, processes, tasks


def test_every_worker_move_of_every_design_is_a_row_and_every_row_is_made() -> None:
    table = {*WORKER_TRANSITIONS, *WORKER_INTERRUPTIONS}
    observed = _observed()[0]
    assert not observed - table, f"moves the worker tables miss: {sorted(observed - table)}"
    assert not table - observed, f"rows no explored step makes: {sorted(table - observed)}"


def test_every_process_move_of_every_design_is_a_row_and_every_row_is_made() -> None:
    table = set(PROCESS_TRANSITIONS)
    observed = _observed()[1]
    assert not observed - table, f"moves the process table misses: {sorted(observed - table)}"
    assert not table - observed, f"rows no explored step makes: {sorted(table - observed)}"


def test_every_task_move_of_the_correct_design_is_a_row_and_every_row_is_made() -> None:
    table = set(TASK_MOVES)
    observed = _observed()[2]
    assert not observed - table, f"moves TASK_MOVES misses: {sorted(observed - table)}"
    assert not table - observed, f"rows no explored step makes: {sorted(table - observed)}"


def test_a_move_the_tables_miss_is_reported() -> None:
    """The coverage check can fail: a worker whose take is lost in the BLPOP design goes back to
    idle, which a table without that row would miss."""
    config = Config(Bounds(tasks=1, servers=1, workers=1, faults=1), variant("blpop-take"))
    state = config.initial()
    lost = Action("dropped_reply", 0, 0, 0, "take")
    moves = set(_worker_moves(state, lost, apply(state, lost, config)))
    assert moves == {(0, "take", 0)}
    assert moves - (set(WORKER_TRANSITIONS) - {(0, "take", 0)})
