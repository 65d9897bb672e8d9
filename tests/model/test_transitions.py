"""Single transitions, written from docs/protocol.md (not from the model's code)."""

from __future__ import annotations

from collections import Counter

import pytest
from taskcustody_model import (
    VARIANTS,
    Action,
    Bounds,
    Config,
    apply,
    enabled_actions,
    initial_state,
    variant,
)
from taskcustody_model.invariants import check_invariants, is_done
from taskcustody_model.state import (
    CRASHED,
    DIRTY,
    ENQUEUED,
    IDLE,
    POISONED,
    RECORDED,
    SUPERSEDED,
    TAKEN,
    WAITING,
    WIPED,
    Registration,
    State,
    Worker,
    list_of,
)

CFG = Config(Bounds(tasks=2, servers=2, workers=2, faults=3), variant("correct"))


def step(
    state: State, name: str, s: int = -1, i: int = -1, w: int = -1, cmd: str = "", cfg: Config = CFG
) -> State:
    action = Action(name, s, i, w, cmd)
    assert action in enabled_actions(state, cfg), f"{action} not enabled"
    after = apply(state, action, cfg)
    assert check_invariants(after, cfg) is None, check_invariants(after, cfg)
    return after


def init() -> State:
    return initial_state(CFG.bounds)


def test_take_moves_the_next_task_into_the_own_inflight_list() -> None:
    st = step(init(), "take", 0, 0, 1)
    assert st.queue == (1,)
    assert list_of(st, (0, 0, 1)) == (0,)
    assert st.processes[0][0].workers[1] == (TAKEN, 0)


def test_dropped_reply_on_take_leaves_the_task_in_custody_and_the_worker_dirty() -> None:
    st = step(init(), "dropped_reply", 0, 0, 0, "take")
    assert list_of(st, (0, 0, 0)) == (0,)  # not lost: BLMOVE put it in our list
    assert st.processes[0][0].workers[0].phase == DIRTY
    mine = {a.name for a in enabled_actions(st, CFG) if a.worker == 0 and a.server == 0}
    assert "take" not in mine
    st = step(st, "reconcile", 0, 0, 0)
    assert st.queue == (1, 0) and not st.lists  # debris back on the queue, taken next
    assert st.processes[0][0].workers[0].phase == IDLE


def test_blpop_take_loses_the_task_on_a_dropped_reply() -> None:
    cfg = CFG._replace(variant=variant("blpop-take"))
    st = apply(init(), Action("dropped_reply", 0, 0, 0, "take"), cfg)
    assert check_invariants(st, cfg) is not None
    assert check_invariants(st, cfg)[0] == "no-loss"  # type: ignore[index]


def test_record_then_release_commits_once_and_clears_custody_and_record() -> None:
    st = step(init(), "take", 0, 0, 0)
    st = step(st, "record", 0, 0, 0)
    assert st.records[0] == (0, 0, 0)
    assert st.processes[0][0].workers[0] == (RECORDED, 0)
    st = step(st, "release", 0, 0, 0)
    assert st.committed == (1, 0)
    assert not st.lists and st.records == (None, None)
    assert st.processes[0][0].workers[0].phase == IDLE


def test_dropped_reply_on_release_commits_but_the_worker_must_reconcile() -> None:
    st = step(
        step(step(init(), "take", 0, 0, 0), "record", 0, 0, 0), "dropped_reply", 0, 0, 0, "release"
    )
    assert st.committed == (1, 0)
    assert st.processes[0][0].workers[0].phase == DIRTY


def test_worker_crash_leaves_the_task_in_its_list_and_a_restart_reconciles() -> None:
    st = step(step(init(), "take", 0, 0, 0), "crash_worker", 0, 0, 0)
    assert st.processes[0][0].workers[0].phase == CRASHED and list_of(st, (0, 0, 0)) == (0,)
    st = step(st, "restart_worker", 0, 0, 0)
    assert st.processes[0][0].workers[0].phase == DIRTY
    st = step(st, "reconcile", 0, 0, 0)
    assert st.queue == (1, 0)


def test_sweep_never_drains_a_registered_servers_list() -> None:
    st = step(init(), "take", 0, 0, 0)
    assert Action("sweep", 1, 0) not in enabled_actions(st, CFG)


def test_sweep_prunes_then_drains_a_crashed_servers_lists() -> None:
    st = step(step(init(), "take", 0, 0, 0), "crash_server", 0, 0)
    assert Action("sweep", 1, 0) not in enabled_actions(st, CFG)  # still registered
    st = step(st, "advance_clock")
    assert st.registry[0] == Registration(0, 0)  # expired, not yet pruned
    st = step(st, "sweep", 1, 0)
    assert st.registry[0] is None and st.queue == (1, 0) and not st.lists


def test_a_healthy_server_stays_registered_across_clock_ticks() -> None:
    st = step(step(init(), "stall_server", 0, 0), "advance_clock")
    assert st.registry[1] == Registration(0, 1) and st.registry[0] == Registration(0, 0)


def test_claim_is_refused_while_the_id_is_registered_and_gives_a_new_incarnation() -> None:
    st = step(init(), "crash_server", 0, 0)
    assert Action("claim", 0) not in enabled_actions(st, CFG)
    st = step(step(st, "advance_clock"), "claim", 0)
    assert st.registry[0] is not None and st.registry[0].inc != 0


def test_startup_drain_recovers_debris_of_an_earlier_incarnation() -> None:
    st = step(step(init(), "take", 0, 0, 0), "crash_server", 0, 0)
    st = step(step(st, "advance_clock"), "claim", 0)
    st = step(st, "startup_drain", 0, 0)
    assert st.queue == (1, 0) and not st.lists


def test_stalled_worker_whose_task_was_recovered_does_not_commit() -> None:
    st = step(step(init(), "take", 0, 0, 0), "record", 0, 0, 0)
    st = step(step(st, "stall_server", 0, 0), "advance_clock")
    st = step(st, "sweep", 1, 0)  # the stalled server looks dead: its list is drained
    st = step(step(st, "take", 1, 0, 0), "record", 1, 0, 0)
    st = step(st, "release", 0, 0, 0)  # the stalled worker finishes: custody lost
    assert st.committed == (0, 0)
    st = step(st, "release", 1, 0, 0)
    assert st.committed == (1, 0)


def test_heartbeat_of_a_superseded_process_stops_it() -> None:
    st = step(step(init(), "stall_server", 0, 0), "advance_clock")
    st = step(st, "claim", 0)  # a new process takes the id while the old one is stalled
    st = step(st, "resume_server", 0, 0)
    st = step(st, "heartbeat", 0, 0)
    assert [p.inc for p in st.processes[0]] == [st.registry[0].inc]  # type: ignore[union-attr]


def test_processing_sweep_requeues_only_what_it_removes_from_custody() -> None:
    st = step(step(init(), "take", 0, 0, 0), "record", 0, 0, 0)
    st = step(step(st, "crash_server", 0, 0), "advance_clock")
    st = step(st, "dropped_reply", 1, 0, -1, "sweep")  # pruned; the pass was abandoned
    assert list_of(st, (0, 0, 0)) == (0,)
    st = step(st, "requeue_stuck_processing_tasks", 1, 0)
    assert st.queue == (1, 0) and not st.lists and st.records == (None, None)


def test_faults_are_bounded() -> None:
    cfg = CFG._replace(bounds=CFG.bounds._replace(faults=0))
    assert not any(a.is_fault for a in enabled_actions(init(), cfg))


def test_done_state() -> None:
    st = init()
    for w in (0, 1):
        st = step(step(step(st, "take", 0, 0, w), "record", 0, 0, w), "release", 0, 0, w)
    assert is_done(st)


# -- the registry of in-flight lists, Redis wipes, late tasks (docs/protocol.md, section 8) ------

WIPE_CFG = Config(
    Bounds(tasks=2, servers=2, workers=1, faults=3, late_tasks=1, redis_faults=True),
    variant("correct"),
)


def wipe_init() -> State:
    return initial_state(WIPE_CFG.bounds)


def test_the_initial_claims_registered_every_workers_list() -> None:
    assert init().registered == ((0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1))


def test_a_late_task_waits_until_the_producer_enqueues_it() -> None:
    st = wipe_init()
    assert st.queue == (0,) and st.status == (ENQUEUED, WAITING)
    st = step(st, "enqueue", cfg=WIPE_CFG)
    assert st.queue == (1, 0) and st.status == (ENQUEUED, ENQUEUED)
    assert Action("enqueue") not in enabled_actions(st, WIPE_CFG)


def test_a_wipe_empties_redis_counts_its_tasks_apart_and_breaks_every_connection() -> None:
    st = step(step(wipe_init(), "take", 0, 0, 0, cfg=WIPE_CFG), "record", 0, 0, 0, cfg=WIPE_CFG)
    st = step(st, "redis_wipe", cfg=WIPE_CFG)
    assert (st.queue, st.lists, st.registered) == ((), (), ())
    assert st.records == (None, None) and st.registry == (None, None)
    assert st.status == (WIPED, WAITING)  # Redis's loss, not the protocol's
    assert [p.workers[0].phase for (p,) in st.processes] == [DIRTY, DIRTY]
    assert check_invariants(st, WIPE_CFG) is None  # task 0 is nowhere, and that is no loss


def test_after_a_wipe_a_task_enqueued_again_is_taken_into_a_registered_list() -> None:
    st = step(wipe_init(), "redis_wipe", cfg=WIPE_CFG)
    st = step(step(st, "reconcile", 0, 0, 0, cfg=WIPE_CFG), "enqueue", cfg=WIPE_CFG)
    st = step(st, "take", 0, 0, 0, cfg=WIPE_CFG)  # the take registers its list again
    assert st.registered == ((0, 0, 0),) and list_of(st, (0, 0, 0)) == (1,)


def test_register_once_takes_after_a_wipe_into_a_list_nobody_can_find() -> None:
    cfg = WIPE_CFG._replace(variant=variant("register-once"))
    st = apply(wipe_init(), Action("redis_wipe"), cfg)
    st = apply(apply(st, Action("reconcile", 0, 0, 0), cfg), Action("enqueue"), cfg)
    st = apply(st, Action("take", 0, 0, 0), cfg)
    assert check_invariants(st, cfg) == (
        "registered-custody",
        "task 1 is in inflight:0:0:0, which is not in the registry of in-flight lists: no "
        "recovery can find it",
    )


def test_a_heartbeat_that_finds_its_registration_gone_registers_its_lists_again() -> None:
    st = step(wipe_init(), "redis_wipe", cfg=WIPE_CFG)
    st = step(st, "heartbeat", 1, 0, cfg=WIPE_CFG)
    assert st.registry[1] == Registration(0, 1) and st.registered == ((1, 0, 0),)


def test_the_sweep_forgets_a_dead_empty_list_but_not_a_live_or_a_full_one() -> None:
    st = step(step(init(), "take", 0, 0, 0), "crash_server", 0, 0)
    st = step(step(st, "advance_clock"), "sweep", 1, 0)
    # server 0 died: its empty list (0, 0, 1) is forgotten; (0, 0, 0) held a task, drained now
    assert st.registered == ((0, 0, 0), (1, 0, 0), (1, 0, 1))
    st = step(st, "sweep", 1, 0)  # next pass: now empty, forgotten too
    assert st.registered == ((1, 0, 0), (1, 0, 1))


def test_the_sweep_spares_a_dead_list_while_a_take_into_it_is_pending() -> None:
    cfg = Config(Bounds(tasks=1, servers=2, workers=1, faults=2), variant("correct"))
    st = step(initial_state(cfg.bounds), "take", 1, 0, 0, cfg=cfg)
    st = step(st, "arm", 0, 0, 0, cfg=cfg)  # the queue is empty: the BLMOVE waits
    st = step(step(st, "stall_server", 0, 0, cfg=cfg), "advance_clock", cfg=cfg)
    st = step(st, "sweep", 1, 0, cfg=cfg)
    assert (0, 0, 0) in st.registered  # the pending take's registration is not old enough
    naive = cfg._replace(variant=variant("gc-when-empty"))
    forgot = apply(
        apply(
            apply(
                apply(initial_state(cfg.bounds), Action("take", 1, 0, 0), naive),
                Action("arm", 0, 0, 0),
                naive,
            ),
            Action("stall_server", 0, 0),
            naive,
        ),
        Action("advance_clock"),
        naive,
    )
    forgot = apply(forgot, Action("sweep", 1, 0), naive)
    assert (0, 0, 0) not in forgot.registered


def test_done_needs_every_late_task_enqueued_and_the_registry_clean() -> None:
    st = wipe_init()
    st = step(
        step(step(st, "take", 0, 0, 0, cfg=WIPE_CFG), "record", 0, 0, 0, cfg=WIPE_CFG),
        "release",
        0,
        0,
        0,
        cfg=WIPE_CFG,
    )
    assert not is_done(st)  # task 1 not enqueued yet
    st = step(st, "enqueue", cfg=WIPE_CFG)
    st = step(
        step(step(st, "take", 1, 0, 0, cfg=WIPE_CFG), "record", 1, 0, 0, cfg=WIPE_CFG),
        "release",
        1,
        0,
        0,
        cfg=WIPE_CFG,
    )
    assert is_done(st)


# -- poison pills (docs/protocol.md, section 9) ---------------------------------------------------

POISON_CFG = Config(
    Bounds(tasks=1, servers=2, workers=1, faults=3, max_recoveries=1), variant("correct")
)


def _held_by_a_stalled_server_and_recovered(st: State) -> State:
    st = step(step(st, "take", 0, 0, 0, cfg=POISON_CFG), "record", 0, 0, 0, cfg=POISON_CFG)
    st = step(step(st, "stall_server", 0, 0, cfg=POISON_CFG), "advance_clock", cfg=POISON_CFG)
    return step(st, "sweep", 1, 0, cfg=POISON_CFG)


def test_a_recovery_counts_the_task_in_the_step_that_requeues_it() -> None:
    st = _held_by_a_stalled_server_and_recovered(initial_state(POISON_CFG.bounds))
    # counted: a suspect, on its own list (not the queue)
    assert st.suspects == (0,) and st.queue == ()
    assert st.recoveries == (1,) and st.executions == (1,)


def test_a_process_takes_one_suspect_at_a_time() -> None:
    cfg = Config(
        Bounds(tasks=3, servers=2, workers=2, faults=2, max_recoveries=2), variant("correct")
    )
    st = initial_state(cfg.bounds)
    for w in (0, 1):  # both workers of server 0 take (tasks 0 and 1) and record
        st = step(step(st, "take", 0, 0, w, cfg=cfg), "record", 0, 0, w, cfg=cfg)
    st = step(step(st, "crash_server", 0, 0, cfg=cfg), "advance_clock", cfg=cfg)
    st = step(st, "sweep", 1, 0, cfg=cfg)
    assert sorted(st.suspects) == [0, 1] and st.queue == (2,)
    first = st.suspects[-1]  # the one drained first: suspects are first in, first out
    st = step(st, "take_suspect", 1, 0, 0, cfg=cfg)
    assert st.processes[1][0].suspect == 0 and st.records[first] == (1, 0, 0)
    enabled = enabled_actions(st, cfg)
    assert Action("take_suspect", 1, 0, 1) not in enabled  # the process holds one already
    assert Action("take", 1, 0, 1) in enabled  # ... and takes ordinary work beside it
    st = step(step(st, "record", 1, 0, 0, cfg=cfg), "release", 1, 0, 0, cfg=cfg)
    assert st.processes[1][0].suspect == -1  # clean again: the slot is free
    assert Action("take_suspect", 1, 0, 1) in enabled_actions(st, cfg)


def test_a_suspect_take_s_lost_reply_keeps_the_slot_until_the_reconcile() -> None:
    st = _held_by_a_stalled_server_and_recovered(initial_state(POISON_CFG.bounds))
    st = step(st, "dropped_reply", 1, 0, 0, "take_suspect", cfg=POISON_CFG)
    assert st.processes[1][0].suspect == 0 and st.lists == (((1, 0, 0), (0,)),)
    st = step(st, "reconcile", 1, 0, 0, cfg=POISON_CFG)
    # the reconcile counted it again (it held it: the take ran): past max_recoveries = 1
    assert st.processes[1][0].suspect == -1 and st.status == (POISONED,)


def test_a_task_recovered_once_too_often_is_dead_lettered_instead_of_requeued() -> None:
    st = _held_by_a_stalled_server_and_recovered(initial_state(POISON_CFG.bounds))
    st = step(st, "release", 0, 0, 0, cfg=POISON_CFG)
    st = step(st, "take_suspect", 0, 0, 0, cfg=POISON_CFG)
    st = step(step(st, "record", 0, 0, 0, cfg=POISON_CFG), "sweep", 1, 0, cfg=POISON_CFG)
    assert st.status == (POISONED,) and st.queue == () and st.suspects == () and not st.lists
    assert st.executions == (2,) and st.committed == (0,)
    st = step(st, "release", 0, 0, 0, cfg=POISON_CFG)  # the stalled worker: custody lost
    assert st.committed == (0,)


def test_a_commit_deletes_the_recovery_count() -> None:
    st = _held_by_a_stalled_server_and_recovered(initial_state(POISON_CFG.bounds))
    st = step(st, "take_suspect", 1, 0, 0, cfg=POISON_CFG)
    st = step(step(st, "record", 1, 0, 0, cfg=POISON_CFG), "release", 1, 0, 0, cfg=POISON_CFG)
    assert st.committed == (1,) and st.recoveries == (0,) and st.suspects == ()


# -- the composite release-and-take (docs/protocol.md, section 2) --------------------------------


def test_release_and_take_commits_and_takes_the_next_task_with_its_record_in_one_step() -> None:
    st = step(step(init(), "take", 0, 0, 0), "record", 0, 0, 0)
    st = step(st, "release_and_take", 0, 0, 0)
    assert st.committed == (1, 0) and st.queue == ()
    assert list_of(st, (0, 0, 0)) == (1,) and st.records == (None, (0, 0, 0))
    assert st.processes[0][0].workers[0] == (RECORDED, 1)  # the handler of task 1 starts
    st = step(st, "release", 0, 0, 0)  # the queue is empty: the plain release
    assert st.committed == (1, 1) and is_done(st)


def test_a_lost_release_and_take_reply_is_a_lost_reply_of_both_halves() -> None:
    cfg = Config(
        Bounds(tasks=2, servers=1, workers=1, faults=2, max_recoveries=1), variant("correct")
    )
    st = step(step(initial_state(cfg.bounds), "take", 0, 0, 0, cfg=cfg), "record", 0, 0, 0, cfg=cfg)
    st = step(st, "dropped_reply", 0, 0, 0, "release_and_take", cfg=cfg)
    # Redis ran both halves: task 0 committed, task 1 is in our list with its record ...
    assert st.committed == (1, 0) and list_of(st, (0, 0, 0)) == (1,)
    assert st.records == (None, (0, 0, 0))
    # ... and the worker knows neither: dirty; task 1's handler never started
    assert st.processes[0][0].workers[0].phase == DIRTY and st.executions == (1, 0)
    st = step(st, "reconcile", 0, 0, 0, cfg=cfg)
    # the reconcile drains it back, counted as every reconcile counts: a suspect now
    assert st.suspects == (1,) and st.recoveries == (0, 1) and st.records == (None, None)


def test_release_and_take_needs_something_to_take_and_a_process_that_is_not_superseded() -> None:
    st = step(step(init(), "take", 0, 0, 0), "record", 0, 0, 0)
    st = step(st, "take", 0, 0, 1)  # the queue is empty now
    enabled = enabled_actions(st, CFG)
    assert Action("release_and_take", 0, 0, 0) not in enabled
    assert Action("dropped_reply", 0, 0, 0, "release_and_take") not in enabled
    assert Action("release", 0, 0, 0) in enabled
    # a superseded process finishes its task with the plain release and takes nothing
    st = step(step(init(), "take", 0, 0, 0), "record", 0, 0, 0)
    st = step(step(st, "stall_server", 0, 0), "advance_clock")
    st = step(step(st, "claim", 0), "resume_server", 0, 0)
    st = step(st, "heartbeat", 0, 0)
    assert st.processes[0][0].phase == SUPERSEDED and st.queue == (1,)
    enabled = enabled_actions(st, CFG)
    assert Action("release_and_take", 0, 0, 0) not in enabled
    assert Action("release", 0, 0, 0) in enabled


def test_release_and_take_takes_a_suspect_while_the_slot_is_free_or_its_own() -> None:
    cfg = Config(
        Bounds(tasks=3, servers=2, workers=2, faults=2, max_recoveries=2), variant("correct")
    )
    st = initial_state(cfg.bounds)
    for w in (0, 1):  # both workers of server 0 take (tasks 0 and 1) and record; it crashes
        st = step(step(st, "take", 0, 0, w, cfg=cfg), "record", 0, 0, w, cfg=cfg)
    st = step(step(st, "crash_server", 0, 0, cfg=cfg), "advance_clock", cfg=cfg)
    st = step(st, "sweep", 1, 0, cfg=cfg)
    assert sorted(st.suspects) == [0, 1] and st.queue == (2,)
    first, second = st.suspects[-1], st.suspects[0]
    st = step(step(st, "take_suspect", 1, 0, 0, cfg=cfg), "record", 1, 0, 0, cfg=cfg)
    st = step(step(st, "take", 1, 0, 1, cfg=cfg), "record", 1, 0, 1, cfg=cfg)
    # worker 1: the slot is worker 0's and the queue is empty: nothing it may take
    assert Action("release_and_take", 1, 0, 1) not in enabled_actions(st, cfg)
    # worker 0: the slot is its own (the suspect it releases now): the next suspect, not task 2
    st = step(st, "release_and_take", 1, 0, 0, cfg=cfg)
    assert st.committed[first] == 1 and st.suspects == ()
    assert st.processes[1][0].workers[0] == (RECORDED, second)
    assert st.processes[1][0].suspect == 0 and st.records[second] == (1, 0, 0)


# The composite and the three steps it fuses stay in step: wherever release_and_take is enabled,
# it is the model's own release, then take (or take_suspect), then record by the same worker,
# with nothing in between (or just the release, when that leaves debris); its lost reply changes
# Redis exactly as that does and leaves the worker dirty, keeping the suspect slot if it held one
# or took one, and starting no handler.

#: small enough to explore without symmetry in under a second each: one server of two workers
#: with suspects (two faults: one makes a suspect, one loses the composite's reply), and two
#: servers of one worker with stalls and successors (custody lost under a composite)
STEP_BOUNDS = (
    Bounds(tasks=2, servers=1, workers=2, faults=2, processes_per_server=1, max_recoveries=1),
    Bounds(tasks=2, servers=2, workers=1, faults=1),
)


def _reachable(cfg: Config) -> set[State]:
    """Every state reachable within ``cfg.bounds`` (as the checker, a state that breaks a
    property is not expanded: a broken design's space need not be finite)."""
    start = initial_state(cfg.bounds)
    seen = {start}
    todo = [start]
    while todo:
        st = todo.pop()
        if check_invariants(st, cfg) is not None:
            continue
        assert len(seen) < 200_000, "the exploration does not end"
        for action in enabled_actions(st, cfg):
            nxt = apply(st, action, cfg)
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _in_sequence(st: State, s: int, i: int, w: int, cfg: Config) -> tuple[State, State, str]:
    """Release, then the take the worker would do next (a suspect first), then record: the states
    after the take and after the record (both the release's if it takes nothing), and what it
    took ("suspect", "queue" or "")."""
    released = apply(st, Action("release", s, i, w), cfg)
    if released.processes[s][i].workers[w].phase != IDLE:
        return released, released, ""  # debris: reconcile first
    enabled = enabled_actions(released, cfg)
    for name, source in (("take_suspect", "suspect"), ("take", "queue")):
        if Action(name, s, i, w) in enabled:
            taken = apply(released, Action(name, s, i, w), cfg)
            return taken, apply(taken, Action("record", s, i, w), cfg), source
    return released, released, ""


def _lost(st: State, s: int, i: int, w: int, taken: State, recorded: State) -> State:
    """What the composite's lost reply leaves: Redis as after the three steps, no execution
    started, one fault more, the worker dirty, and the slot its own if it held it or took one."""
    proc = recorded.processes[s][i]
    slot = w if st.processes[s][i].suspect == w else proc.suspect
    proc = proc._replace(
        workers=(*proc.workers[:w], Worker(DIRTY), *proc.workers[w + 1 :]), suspect=slot
    )
    procs = recorded.processes[s]
    return recorded._replace(
        processes=(
            *recorded.processes[:s],
            (*procs[:i], proc, *procs[i + 1 :]),
            *recorded.processes[s + 1 :],
        ),
        executions=taken.executions,
        faults=recorded.faults + 1,
    )


def _divergences(cfg: Config) -> tuple[list[str], Counter[str]]:
    wrong: list[str] = []
    seen: Counter[str] = Counter()
    for st in _reachable(cfg):
        for action in enabled_actions(st, cfg):
            if action.name == "dropped_reply" and action.command == "release_and_take":
                name = "lost"
            elif action.name == "release_and_take":
                name = "ok"
            else:
                continue
            s, i, w = action.server, action.proc, action.worker
            taken, recorded, source = _in_sequence(st, s, i, w, cfg)
            want = recorded if name == "ok" else _lost(st, s, i, w, taken, recorded)
            if apply(st, action, cfg) != want:
                wrong.append(f"{action} in {st}")
            proc = st.processes[s][i]
            key = (s, proc.inc, w)
            held = proc.workers[w].task in list_of(st, key)
            seen[f"{name} {source or 'nothing'}"] += 1
            if not held:
                seen[f"{name} {source or 'nothing'} custody-lost"] += 1
            if proc.suspect == w:
                seen[f"{name} {source or 'nothing'} slot-own"] += 1
    return wrong, seen


@pytest.mark.parametrize("bounds", STEP_BOUNDS, ids=["1x2-suspects", "2x1-stalls"])
def test_the_composite_is_release_then_take_then_record(bounds: Bounds) -> None:
    wrong, seen = _divergences(Config(bounds, variant("correct")))
    assert not wrong, wrong[:3]
    assert seen["ok queue"] and seen["lost queue"]
    if bounds.max_recoveries is not None:
        assert seen["ok suspect"] and seen["lost suspect"]
        assert seen["ok suspect slot-own"] and seen["ok queue slot-own"]
    else:
        assert seen["ok queue custody-lost"]


@pytest.mark.parametrize(
    "name", sorted(set(VARIANTS) - {"correct", "composite-pops-next", "composite-commits-unheld"})
)
def test_every_other_design_s_composite_is_its_own_three_steps(name: str) -> None:
    """Whatever else a design changes, its composite is still its release, take and record."""
    for bounds in STEP_BOUNDS:
        wrong, _ = _divergences(Config(bounds, variant(name)))
        assert not wrong, wrong[:3]


@pytest.mark.parametrize("name", ["composite-pops-next", "composite-commits-unheld"])
def test_designs_14_and_15_are_where_the_composite_leaves_the_three_steps(name: str) -> None:
    """The two broken composites are the test's own counterexamples: it tells them apart."""
    wrong, _ = _divergences(Config(STEP_BOUNDS[1], variant(name)))
    assert wrong
