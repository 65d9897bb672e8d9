"""`verify/narrate.py`: states, steps, faults and broken properties in words."""

from __future__ import annotations

from taskcustody_model import Action, Bounds, State, initial_state
from taskcustody_model.invariants import WHY
from taskcustody_model.state import RECORDED, TAKEN
from taskcustody_model.state import Worker as ModelWorker

from taskcustody.verify import narrate

BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=3)


def _holding(state: State, s: int, w: int, t: int, phase: int = TAKEN) -> State:
    """`state` with worker `w` of server `s`'s only process holding task `t`."""
    proc = state.processes[s][0]
    workers = tuple(ModelWorker(phase, t) if i == w else wk for i, wk in enumerate(proc.workers))
    procs = (proc._replace(workers=workers), *state.processes[s][1:])
    return state._replace(processes=(*state.processes[:s], procs, *state.processes[s + 1 :]))


def _taken(t: int = 0) -> State:
    """Server 0's worker 0 took task 0 into inflight:s0:0:w0; tasks 2 and 1 are queued."""
    start = initial_state(BOUNDS)._replace(queue=(2, 1))
    return _holding(start._replace(lists=(((0, 0, 0), (t,)),)), 0, 0, t)


def test_a_task_in_the_queue_and_a_list_is_said_in_words() -> None:
    state = _taken()._replace(queue=(2, 1, 0))
    assert narrate.task_line(state, 0) == (
        "task 0: in the queue (1st to be taken) and in inflight:s0:0:w0; "
        "worker s0:0:w0 holds it (taken, not recorded yet)"
    )
    assert narrate.task_line(state, 2) == "task 2: in the queue (3rd to be taken)"


def test_a_task_only_in_a_workers_memory_is_said_to_be_there_only() -> None:
    state = _holding(initial_state(BOUNDS)._replace(queue=(2, 1)), 0, 0, 0)
    line = narrate.task_line(state, 0)
    assert line.startswith("task 0: in no queue or list, and not committed;")
    assert "in that worker's memory only" in line


def test_a_recorded_task_names_its_record_and_an_unregistered_list() -> None:
    state = _holding(_taken(), 0, 0, 0, RECORDED)._replace(
        records=((0, 0, 0), None, None), registered=()
    )
    line = narrate.task_line(state, 0)
    assert "in inflight:s0:0:w0 (a list missing from the registry of in-flight lists)" in line
    assert "its processing record names inflight:s0:0:w0" in line
    assert "(recorded, its handler runs)" in line


def test_servers_are_described_with_their_workers() -> None:
    state = _taken()
    lines = narrate.server_lines(state)
    assert lines[0] == (
        "server s0: registered as incarnation 0, deadline in 1 tick; "
        "incarnation 0 running (w0 holds task 0, w1 idle)"
    )
    crashed = state._replace(processes=(state.processes[0], ()))
    assert narrate.server_lines(crashed)[1].endswith("no process running")


def test_a_duplicate_in_the_queue_is_said_task_by_task() -> None:
    """What the check prints as `queue: model (2, 1) != real (2, 1, 0)`."""
    model = _taken()
    real = model._replace(queue=(2, 1, 0))
    lines = narrate.difference(model, real)
    assert lines[0] == (
        "task 0: the model has it in inflight:s0:0:w0; Redis has it in the "
        "queue and in inflight:s0:0:w0"
    )
    assert lines[1].strip().startswith("that is a duplicate: Redis holds task 0 in 2 places")
    assert len(lines) == 2  # tasks 1 and 2 only moved back a turn: not a difference


def test_a_live_workers_task_offered_again_is_a_duplicate() -> None:
    model = _taken()
    real = model._replace(lists=(), suspects=(0,))
    lines = narrate.difference(model, real)
    assert "Redis has it in the suspects list" in lines[0]
    assert "worker s0:0:w0 still holds task 0" in lines[1] and "run twice" in lines[1]


def test_a_task_missing_from_redis_is_a_loss() -> None:
    model = _taken()
    real = _holding(initial_state(BOUNDS)._replace(queue=(2, 1)), 0, 0, 0)
    lines = narrate.difference(model, real)
    assert "Redis has it in no queue or list, and not committed" in lines[0]
    assert "that is a loss" in lines[1]


def test_equal_states_have_no_difference_and_any_other_field_is_named() -> None:
    state = _taken()
    assert narrate.difference(state, state) == []
    other = state._replace(stalled_ever=True)
    assert narrate.difference(state, other) == ["stalled_ever: the model has False; Redis has True"]


def test_faults_are_said_and_counted_by_kind() -> None:
    lost = Action("dropped_reply", 0, 0, 0, command="take")
    crash = Action("crash_server", 1, 0)
    take = Action("take", 0, 0, 0)
    assert "reply to take was lost" in narrate.fault_of(lost)
    assert narrate.fault_of(take) == ""
    assert "crashed" in narrate.fault_of(crash)
    assert narrate.faults_by_kind([take, lost, crash, lost]) == {
        "crash_server": 1,
        "dropped-reply:take": 2,
    }


def test_a_broken_property_gets_its_side_and_its_sentence() -> None:
    b = narrate.broken("real:no-loss", "task 0 is lost")
    assert (b.property, b.side, b.message, b.why) == (
        "no-loss",
        "in the state read from Redis",
        ["task 0 is lost"],
        WHY["no-loss"],
    )
    step = narrate.Step(1, "take", "", [], [], ["task 0: the model has it ..."])
    c = narrate.broken("conformance", "queue: model (2, 1) != real (2, 1, 0)", step)
    assert c.message == ["task 0: the model has it ..."]  # words, not the tuples
    assert c.side == "Redis against the model" and c.why == narrate.HARNESS_WHY["conformance"]
    assert narrate.broken("eventual", "x").why == WHY["eventual-recovery"]


def test_a_property_broken_during_recovery_says_so() -> None:
    step = narrate.Step(1, "take", "", [], [], [], recovery=True)
    b = narrate.broken("real:no-loss", "task 0 is lost", step)
    assert b.side == "in the state read from Redis, during recovery, after faults stopped"


def test_a_model_message_names_lists_as_the_sentences_do() -> None:
    b = narrate.broken("bounded-work", "a drain of inflight:0:1:0 made 2 moves")
    assert b.message == ["a drain of inflight:s0:1:w0 made 2 moves"]
