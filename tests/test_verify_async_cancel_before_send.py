"""asyncio's own fault in the stateful run (`verify --async`, verify/aio.py): a worker step
cancelled before its command is sent. The machine draws a lost reply; with the bounds'
`cancels_before_send` and variants 2 and 5 the harness cancels the step at the await of its send
instead, and the model takes its `cancel_before_send` (nothing moved, the worker dirty). The
correct asyncio worker agrees with the model after every step and recovers; a worker that takes a
cancelled release for one that ran (design 16, `cancelled-release-ran`) is caught at that step."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from taskcustody_model import Action, Bounds
from taskcustody_model.state import DIRTY, list_of

from taskcustody.aio import AsyncWorker
from taskcustody.core.outcome import Release
from taskcustody.verify import aio
from taskcustody.verify.aio import AsyncHarness
from taskcustody.verify.harness import Mismatch
from tests.conftest import Backend

BOUNDS = Bounds(
    tasks=2, servers=1, workers=1, faults=2, processes_per_server=1, cancels_before_send=True
)
#: the variant that makes a worker step's lost reply a cancellation before the send
BEFORE_SEND = 2


@pytest.fixture
def harness(backend: Backend) -> Iterator[AsyncHarness]:
    h = AsyncHarness(backend.client, BOUNDS, real_redis=backend.real)
    try:
        h.setup()
        yield h
    finally:
        h.close()


def _do(h: AsyncHarness, name: str, command: str = "", variant: int = 0) -> None:
    h.step(Action(name, 0, 0, 0, command), variant=variant)
    h.check()


def _take_and_record(h: AsyncHarness) -> None:
    _do(h, "take")
    _do(h, "record")


def _recovers(h: AsyncHarness) -> None:
    h.recover()
    h.check()
    h.check_eventual()
    tallies = h.tallies()
    assert tallies["committed"] == BOUNDS.tasks
    assert tallies["lost"] == tallies["duplicated"] == 0


def test_a_release_cancelled_before_its_send_moves_nothing_and_leaves_the_worker_dirty(
    harness: AsyncHarness,
) -> None:
    h = harness
    _take_and_record(h)
    _do(h, "dropped_reply", "release", BEFORE_SEND)
    assert h.steps[-1].action == Action("cancel_before_send", 0, 0, 0, "release")
    assert h.counts["cancelled-before-send:release"] == 1
    assert h.state.processes[0][0].workers[0].phase == DIRTY
    assert list_of(h.state, (0, 0, 0)) == (0,)  # the task is still in the worker's list
    assert h.state.committed == (0, 0)
    _recovers(h)


def test_a_take_cancelled_before_its_send_moves_nothing_and_leaves_the_worker_dirty(
    harness: AsyncHarness,
) -> None:
    h = harness
    queue = h.state.queue
    _do(h, "dropped_reply", "take", BEFORE_SEND)
    assert h.steps[-1].action.name == "cancel_before_send"
    assert h.state.queue == queue and h.state.lists == ()
    assert h.state.processes[0][0].workers[0].phase == DIRTY
    _recovers(h)


def test_a_composite_cancelled_before_its_send_moves_nothing_and_leaves_the_worker_dirty(
    harness: AsyncHarness,
) -> None:
    h = harness
    _take_and_record(h)
    _do(h, "dropped_reply", "release_and_take", BEFORE_SEND)
    assert h.steps[-1].action.name == "cancel_before_send"
    assert h.state.queue == (1,) and list_of(h.state, (0, 0, 0)) == (0,)
    assert h.state.processes[0][0].workers[0].phase == DIRTY
    _recovers(h)


def test_other_variants_keep_the_lost_reply_and_the_cancellation_in_flight(
    harness: AsyncHarness,
) -> None:
    h = harness
    _do(h, "dropped_reply", "take", 0)  # a dropped reply: the take ran
    _do(h, "reconcile")
    _do(h, "dropped_reply", "take", 1)  # cancelled in flight: the take ran
    assert [s.action.name for s in h.steps] == ["dropped_reply", "reconcile", "dropped_reply"]
    assert h.counts["cancelled-in-flight:take"] == 1
    assert "cancel_before_send" not in h.counts
    _recovers(h)


class CancelledReleaseRan(AsyncWorker):
    """16. A worker that takes a cancelled release for one that ran (the named mutant's bug)."""

    async def _release_raw(self, raw: bytes, task_id: str, action: str, data: str) -> Release:
        try:
            return await super()._release_raw(raw, task_id, action, data)
        except asyncio.CancelledError:
            self.dirty = False
            self.suspects.release(self.list_key)
            raise


def test_a_worker_that_takes_a_cancelled_release_for_one_that_ran_is_caught(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aio, "AsyncWorker", CancelledReleaseRan)
    h = AsyncHarness(backend.client, BOUNDS, real_redis=backend.real)
    try:
        h.setup()
        _take_and_record(h)
        with pytest.raises(Mismatch) as caught:
            _do(h, "dropped_reply", "release", BEFORE_SEND)
        assert caught.value.kind == "conformance", caught.value
        assert h.steps[-1].action.name == "cancel_before_send"
    finally:
        h.close()


def test_verify_async_model_checks_and_runs_with_cancellations_before_the_send() -> None:
    from taskcustody.verify.machine import ASYNC_BOUNDS, DEFAULT_BOUNDS
    from taskcustody.verify.run import MODEL_BOUNDS, Options, model_bounds

    assert model_bounds(Options(asyncio=True)) == MODEL_BOUNDS._replace(cancels_before_send=True)
    assert model_bounds(Options()) == MODEL_BOUNDS  # the threaded run's: unchanged
    assert (
        Options(asyncio=True).stateful_bounds
        == ASYNC_BOUNDS
        == DEFAULT_BOUNDS._replace(cancels_before_send=True)
    )
    assert not Options().stateful_bounds.cancels_before_send


def test_a_before_send_arm_cancels_the_sending_task_and_redis_runs_nothing() -> None:
    import fakeredis.aioredis

    from taskcustody.verify import faults

    async def scenario() -> tuple[bool, bytes | None, int]:
        injector = faults.FaultInjector()
        client = await faults.install_async(fakeredis.aioredis.FakeRedis(), injector, "x")
        injector.arm("SET", label="x", before_send=True)
        cancelled = False
        try:
            await asyncio.ensure_future(client.set("k", b"v"))
        except asyncio.CancelledError:
            cancelled = True
        value = await client.get("k")
        await client.set("k2", b"v")  # spent: the next SET goes through
        await client.connection_pool.disconnect()
        return cancelled, value, injector.counts[faults.CANCELLED_BEFORE_SEND]

    assert asyncio.run(scenario()) == (True, None, 1)
