"""Single transitions, written from docs/protocol.md (not from the model's code)."""

from __future__ import annotations

from taskcustody_model import Action, Bounds, Config, apply, enabled_actions, initial_state, variant
from taskcustody_model.invariants import check_invariants, is_done
from taskcustody_model.state import (
    CRASHED,
    DIRTY,
    ENQUEUED,
    IDLE,
    POISONED,
    RECORDED,
    TAKEN,
    WAITING,
    WIPED,
    Registration,
    State,
    list_of,
)

CFG = Config(Bounds(tasks=2, servers=2, workers=2, faults=3), variant("correct"))


def step(state: State, name: str, s: int = -1, i: int = -1, w: int = -1, cmd: str = "",
         cfg: Config = CFG) -> State:
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
    st = step(step(step(init(), "take", 0, 0, 0), "record", 0, 0, 0), "dropped_reply",
              0, 0, 0, "release")
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

WIPE_CFG = Config(Bounds(tasks=2, servers=2, workers=1, faults=3, late_tasks=1,
                         redis_faults=True), variant("correct"))


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
    forgot = apply(apply(apply(apply(initial_state(cfg.bounds), Action("take", 1, 0, 0), naive),
                               Action("arm", 0, 0, 0), naive),
                         Action("stall_server", 0, 0), naive), Action("advance_clock"), naive)
    forgot = apply(forgot, Action("sweep", 1, 0), naive)
    assert (0, 0, 0) not in forgot.registered


def test_done_needs_every_late_task_enqueued_and_the_registry_clean() -> None:
    st = wipe_init()
    st = step(step(step(st, "take", 0, 0, 0, cfg=WIPE_CFG), "record", 0, 0, 0, cfg=WIPE_CFG),
              "release", 0, 0, 0, cfg=WIPE_CFG)
    assert not is_done(st)  # task 1 not enqueued yet
    st = step(st, "enqueue", cfg=WIPE_CFG)
    st = step(step(step(st, "take", 1, 0, 0, cfg=WIPE_CFG), "record", 1, 0, 0, cfg=WIPE_CFG),
              "release", 1, 0, 0, cfg=WIPE_CFG)
    assert is_done(st)


# -- poison pills (docs/protocol.md, section 9) ---------------------------------------------------

POISON_CFG = Config(Bounds(tasks=1, servers=2, workers=1, faults=3, max_recoveries=1),
                    variant("correct"))


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
    cfg = Config(Bounds(tasks=3, servers=2, workers=2, faults=2, max_recoveries=2),
                 variant("correct"))
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
