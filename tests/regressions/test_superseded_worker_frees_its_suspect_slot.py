"""A worker of a superseded process that releases the suspect it holds, with the release's reply
seen and nothing else in its list, frees its process's suspect slot as it stops: the
implementation's release frees the slot whenever it leaves the worker clean (`Custody.released`).
The model kept the slot of a worker that stopped (it freed it only for one that went idle), so the
two disagreed on that step (found by `taskcustody verify --async` at 200 examples, part
3; the threaded harness replays it: the model's corner, not the asyncio worker's). Every model
bound that counts recoveries has one process per server id, so no checker run met it."""

from __future__ import annotations

import pytest
from taskcustody_model import Action, Bounds, Config, apply, enabled_actions, variant
from taskcustody_model.state import STOPPED, SUPERSEDED, State, initial_state

from taskcustody.verify.aio import AsyncHarness
from taskcustody.verify.harness import Harness
from tests.conftest import Backend

BOUNDS = Bounds(tasks=2, servers=2, workers=2, faults=3, max_recoveries=1)

#: a suspect (task 0, recovered from a crashed worker) taken by server 0's worker 0 (worker 1
#: holds task 1, so that the process does not exit with worker 0); the process is superseded,
#: then worker 0 releases the suspect and stops
STEPS = (
    Action("take", 1, 0, 0),
    Action("crash_worker", 1, 0, 0),
    Action("restart_worker", 1, 0, 0),
    Action("reconcile", 1, 0, 0),
    Action("take", 0, 0, 1),
    Action("take_suspect", 0, 0, 0),
    Action("record", 0, 0, 0),
    Action("stall_server", 0, 0),
    Action("advance_clock"),
    Action("claim", 0),
    Action("resume_server", 0, 0),
    Action("heartbeat", 0, 0),
)
RELEASE = Action("release", 0, 0, 0)


def _model_before_the_release() -> tuple[State, Config]:
    cfg = Config(BOUNDS, variant("correct"))
    state = initial_state(BOUNDS)
    for action in STEPS:
        assert action in enabled_actions(state, cfg), action
        state = apply(state, action, cfg)
    assert state.processes[0][0].phase == SUPERSEDED and state.processes[0][0].suspect == 0
    return state, cfg


def test_the_model_frees_the_slot_of_a_stopping_worker_whose_release_was_clean() -> None:
    state, cfg = _model_before_the_release()
    after = apply(state, RELEASE, cfg)
    assert after.processes[0][0].workers[0].phase == STOPPED
    assert after.processes[0][0].suspect == -1
    # a release whose end it did not see leaves the worker holding the slot, stopping or not
    lost = apply(state, RELEASE._replace(name="dropped_reply", command="release"), cfg)
    assert lost.processes[0][0].suspect == 0


@pytest.mark.parametrize("harness_class", [Harness, AsyncHarness], ids=["threaded", "asyncio"])
def test_the_implementation_agrees_step_by_step(
    backend: Backend, harness_class: type[Harness]
) -> None:
    h = harness_class(backend.client, BOUNDS, real_redis=backend.real)
    try:
        h.setup()
        for action in (*STEPS, RELEASE):
            h.step(action)
            h.check()  # the release's check failed: the model's slot was still held
        assert h.state.processes[0][0].suspect == -1
    finally:
        h.close()
