"""asyncio's fault in the model: a worker step cancelled before its command is sent
(``cancel_before_send``, with ``Bounds.cancels_before_send``; docs/protocol.md, section 5).
Nothing moves in Redis and the worker is dirty; the checker accepts the correct design with it
and rejects design 16 (``cancelled-release-ran``: a cancelled release taken for one that ran),
which only this fault tells apart from the correct design."""

from __future__ import annotations

from taskcustody_model import Action, Bounds, Config, apply, enabled_actions, initial_state, variant
from taskcustody_model.invariants import check_invariants
from taskcustody_model.state import (
    ARMED,
    DIRTY,
    IDLE,
    RECORDED,
    SUPERSEDED,
    State,
    list_of,
)
from taskcustody_model.trace import render_trace

from taskcustody.verify.designs import CANCEL_BOUNDS

from .searches import check

CFG = Config(
    Bounds(tasks=2, servers=2, workers=2, faults=3, cancels_before_send=True), variant("correct")
)
#: with poison-pill detection: a recovered task is a suspect, taken under the process's slot
SLOT_CFG = Config(CFG.bounds._replace(max_recoveries=1), variant("correct"))


def step(
    state: State, name: str, s: int = -1, i: int = -1, w: int = -1, cmd: str = "", cfg: Config = CFG
) -> State:
    action = Action(name, s, i, w, cmd)
    assert action in enabled_actions(state, cfg), f"{action} not enabled"
    after = apply(state, action, cfg)
    assert check_invariants(after, cfg) is None, check_invariants(after, cfg)
    return after


def cancel(state: State, cmd: str, s: int = 0, w: int = 0, cfg: Config = CFG) -> State:
    return step(state, "cancel_before_send", s, 0, w, cmd, cfg)


def _redis(state: State) -> tuple[object, ...]:
    """What Redis holds (every field but the processes and the fault count)."""
    return (
        state.queue,
        state.lists,
        state.records,
        state.committed,
        state.registry,
        state.registered,
        state.recoveries,
        state.suspects,
        state.scheduled,
    )


def test_it_is_off_by_default_so_the_other_bounds_keep_their_state_space() -> None:
    off = Config(CFG.bounds._replace(cancels_before_send=False), CFG.variant)
    state = step(
        step(initial_state(off.bounds), "take", 0, 0, 0, cfg=off), "record", 0, 0, 0, cfg=off
    )
    assert not any(a.name == "cancel_before_send" for a in enabled_actions(state, off))
    assert Action("cancel_before_send", 0, 0, 0, "release") in enabled_actions(state, CFG)


def test_a_cancelled_take_moves_nothing_and_leaves_the_worker_dirty() -> None:
    before = initial_state(CFG.bounds)
    after = cancel(before, "take")
    assert _redis(after) == _redis(before)  # no take, no registration
    assert after.processes[0][0].workers[0].phase == DIRTY
    assert after.faults == 1
    # its reconcile finds the list as it was (empty): clean again, nothing moved
    clean = step(after, "reconcile", 0, 0, 0)
    assert clean.processes[0][0].workers[0].phase == IDLE and _redis(clean) == _redis(before)


def test_a_cancelled_release_leaves_the_task_in_custody_and_the_worker_dirty() -> None:
    held = step(step(initial_state(CFG.bounds), "take", 0, 0, 0), "record", 0, 0, 0)
    after = cancel(held, "release")
    assert _redis(after) == _redis(held)  # no release, no commit: task 0 in the list, recorded
    assert list_of(after, (0, 0, 0)) == (0,) and after.committed == (0, 0)
    assert after.processes[0][0].workers[0].phase == DIRTY
    # the reconcile gives the task back to the queue's take end, as after a crash
    back = step(after, "reconcile", 0, 0, 0)
    assert back.queue[-1] == 0 and list_of(back, (0, 0, 0)) == () and back.records[0] is None


def test_a_cancelled_composite_moves_nothing_and_leaves_the_worker_dirty() -> None:
    held = step(step(initial_state(CFG.bounds), "take", 0, 0, 0), "record", 0, 0, 0)
    after = cancel(held, "release_and_take")
    assert _redis(after) == _redis(held)
    assert after.processes[0][0].workers[0].phase == DIRTY


def _with_a_suspect() -> State:
    """Task 0 recovered once (its holder crashed): the suspects list holds it."""
    st = step(initial_state(SLOT_CFG.bounds), "take", 1, 0, 0, cfg=SLOT_CFG)
    st = step(st, "crash_worker", 1, 0, 0, cfg=SLOT_CFG)
    st = step(st, "restart_worker", 1, 0, 0, cfg=SLOT_CFG)
    st = step(st, "reconcile", 1, 0, 0, cfg=SLOT_CFG)
    assert st.suspects == (0,)
    return st


def test_a_cancelled_suspect_take_keeps_the_slot_it_took_before_the_send() -> None:
    before = _with_a_suspect()
    after = cancel(before, "take_suspect", cfg=SLOT_CFG)
    assert _redis(after) == _redis(before)  # the suspect is still waiting
    assert after.processes[0][0].suspect == 0
    assert after.processes[0][0].workers[0].phase == DIRTY
    # so no other worker of the process takes a suspect until this one is clean again
    assert Action("take_suspect", 0, 0, 1) not in enabled_actions(after, SLOT_CFG)
    clean = step(after, "reconcile", 0, 0, 0, cfg=SLOT_CFG)
    assert clean.processes[0][0].suspect == -1


def test_a_composite_that_would_take_a_suspect_keeps_the_slot_it_took_before_the_send() -> None:
    st = step(_with_a_suspect(), "take", 0, 0, 0, cfg=SLOT_CFG)
    st = step(st, "record", 0, 0, 0, cfg=SLOT_CFG)
    after = cancel(st, "release_and_take", cfg=SLOT_CFG)
    assert after.processes[0][0].suspect == 0 and after.suspects == (0,)


def test_an_armed_take_cannot_be_cancelled_before_its_send() -> None:
    """An armed take's BLMOVE was sent when it armed: a cancellation now is one in flight."""
    bounds = CFG.bounds._replace(tasks=1, late_tasks=1)
    cfg = Config(bounds, CFG.variant)
    armed = step(initial_state(bounds), "arm", 0, 0, 0, cfg=cfg)
    assert armed.processes[0][0].workers[0].phase == ARMED
    armed = step(armed, "enqueue", cfg=cfg)
    assert Action("cancel_before_send", 0, 0, 0, "take") not in enabled_actions(armed, cfg)
    assert Action("take", 0, 0, 0) in enabled_actions(armed, cfg)


def _superseded_holder(cfg: Config) -> State:
    """Server 0's process holds task 0 (recorded) and is superseded by a successor."""
    st = step(initial_state(cfg.bounds), "take", 0, 0, 0, cfg=cfg)
    st = step(st, "record", 0, 0, 0, cfg=cfg)
    st = step(st, "stall_server", 0, 0, cfg=cfg)
    st = step(st, "advance_clock", cfg=cfg)
    st = step(st, "claim", 0, cfg=cfg)
    st = step(st, "resume_server", 0, 0, cfg=cfg)
    st = step(st, "heartbeat", 0, 0, cfg=cfg)
    assert st.processes[0][0].phase == SUPERSEDED
    assert st.processes[0][0].workers[0].phase == RECORDED
    return st


def test_a_superseded_process_s_cancelled_release_stops_its_worker() -> None:
    st = _superseded_holder(CFG)
    after = cancel(st, "release")
    # its worker stopped, so did the other (idle when superseded): the process exited
    assert [p.inc for p in after.processes[0]] == [1]
    assert list_of(after, (0, 0, 0)) == (0,)  # a sweep of the successor recovers it


# -- the checker ----------------------------------------------------------------------------------


def test_the_checker_accepts_the_correct_design_with_cancellations_before_the_send() -> None:
    result = check(CANCEL_BOUNDS)
    assert result.ok, result.violation and render_trace(result.violation)
    # (its figures are pinned in test_checker_figures.py, "cancels-before-send")
    # Without the slot, a cancellation before the send reaches no new state: a crash and a
    # restart reach each one (dirty, nothing moved); it only adds transitions.
    without = check(CANCEL_BOUNDS._replace(cancels_before_send=False))
    assert without.distinct_states == result.distinct_states
    assert without.states_generated < result.states_generated


def test_the_checker_accepts_it_with_the_suspect_slot() -> None:
    """With poison-pill detection it does reach new states: a dirty worker that holds the slot
    while the suspect is still waiting (2,875 distinct states against 2,843 without)."""
    bounds = Bounds(
        tasks=2,
        servers=1,
        workers=2,
        faults=2,
        processes_per_server=1,
        max_recoveries=1,
        cancels_before_send=True,
    )
    result = check(bounds)
    assert result.ok, result.violation and render_trace(result.violation)
    assert (
        result.distinct_states > check(bounds._replace(cancels_before_send=False)).distinct_states
    )


def test_design_16_breaks_eventual_recovery_in_a_cancelled_release() -> None:
    """Pinned in the designs table (4 steps, eventual-recovery): two workers take, one records,
    its release is cancelled before the send; it goes idle with task 0 in its live list."""
    result = check(CANCEL_BOUNDS, "cancelled-release-ran")
    assert result.violation is not None and result.violation.eventual
    assert [(s.action.name, s.action.command) for s in result.violation.steps] == [
        ("take", ""),
        ("take", ""),
        ("record", ""),
        ("cancel_before_send", "release"),
    ]
    last = result.violation.steps[-1].state
    assert list_of(last, (0, 0, 0)) == (0,) and last.queue == ()


def test_only_a_cancellation_before_the_send_tells_design_16_from_the_correct_design() -> None:
    """Without the fault, design 16 (a release whose end it did not see taken for one that ran)
    explores exactly the correct design's states: after a lost reply the script ran, and a worker
    that holds a task has nothing else in its list."""
    for bounds in (
        CANCEL_BOUNDS._replace(cancels_before_send=False),
        Bounds(3, 2, 2, 1, processes_per_server=1),
    ):
        broken, correct = check(bounds, "cancelled-release-ran"), check(bounds)
        assert broken.ok, broken.violation and render_trace(broken.violation)
        assert (broken.distinct_states, broken.depth) == (correct.distinct_states, correct.depth)
