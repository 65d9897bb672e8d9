"""The worker's production loop (`Worker.run`) and its handling of a failed deferred command,
driven in-process: run_once is scripted, the stop event records the pauses it is asked for."""

from __future__ import annotations

import logging

import fakeredis
import pytest
import redis

from taskcustody import ManualClock, QueueKeys, Settings, Worker, connect_fake
from taskcustody.core import scripts
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import Stop, make_server

WORKER_LOG = "taskcustody.worker"


def new_worker(client: redis.Redis, keys: QueueKeys, settings: Settings = TEST_SETTINGS) -> Worker:
    server = make_server(client, keys, "s1", ManualClock(), settings=settings)
    server.claim()
    return server.make_worker(0)


def script(worker: Worker, stop: Stop, steps: list[object]) -> list[bool]:
    """Replace run_once: each call takes the next step (a result to return, or an exception to
    raise), recording whether the worker was dirty at that call (and cleaning it, as the real
    reconcile would). When the steps run out, the stop is set."""
    dirty_at_call: list[bool] = []

    def run_once(timeout: float | None = None) -> bool:
        dirty_at_call.append(worker.dirty)
        worker.dirty = False
        if not steps:
            stop.set()
            return False
        step = steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        assert isinstance(step, bool)
        return step

    worker.run_once = run_once  # type: ignore[method-assign]
    return dirty_at_call


@pytest.fixture
def fake() -> redis.Redis:
    return connect_fake(fakeredis.FakeServer())


def test_run_loads_its_scripts_before_anything_else(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    client.script_flush()
    worker = new_worker(client, keys)
    shas = scripts.RECORD_SCRIPT.sha, scripts.RELEASE_SCRIPT.sha
    assert client.script_exists(*shas) == [False, False]
    stop = Stop()
    stop.set()
    calls = script(worker, stop, [])
    worker.run(stop)  # type: ignore[arg-type]
    assert calls == []  # stopped: never took
    # registered by the claim (and again by every take), not by run()
    assert client.zrange(keys.inflight_registry, 0, -1) == [worker.list_key.encode()]
    assert client.script_exists(*shas) == [True, True]
    worker.close()


def test_run_by_default_keeps_taking_through_idle_spells_until_stopped(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    worker = new_worker(fake, keys)
    stop = Stop()
    calls = script(worker, stop, [True, False, False, True, False])
    worker.run(stop)  # type: ignore[arg-type]
    assert len(calls) == 6 and stop.waits == []  # five scripted steps, then the stop


def test_run_until_idle_returns_at_the_first_empty_take(fake: redis.Redis, keys: QueueKeys) -> None:
    worker = new_worker(fake, keys)
    stop = Stop()
    calls = script(worker, stop, [True, True, False, True])
    worker.run(stop, until_idle=True)  # type: ignore[arg-type]
    assert len(calls) == 3 and not stop.flag


@pytest.mark.parametrize(("block", "pause"), [(0.05, 0.05), (2.0, 1.0)])
def test_run_rides_out_redis_errors_dirty_after_a_short_pause(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture, block: float, pause: float
) -> None:
    settings = Settings(block_timeout=block, heartbeat_interval=5, server_ttl=15)
    worker = new_worker(fake, keys, settings)
    worker.dirty = False
    stop = Stop()
    # Errors are not "idle": with until_idle, the loop goes on after each of them.
    calls = script(
        worker,
        stop,
        [redis.ConnectionError("refused"), True, redis.TimeoutError("slow"), False, True],
    )
    with caplog.at_level(logging.INFO, logger=WORKER_LOG):
        worker.run(stop, until_idle=True)  # type: ignore[arg-type]
    assert calls == [False, True, False, True]  # dirty at the call after each error
    assert stop.waits == [pause, pause]  # min(1 s, block_timeout) after each error
    assert [r.getMessage() for r in caplog.records if r.name == WORKER_LOG] == [
        f"worker {worker.list_key}: Redis unreachable (refused); will reconcile",
        f"worker {worker.list_key}: Redis unreachable (slow); will reconcile",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == WORKER_LOG)


def test_run_stops_after_an_error_once_stopped(fake: redis.Redis, keys: QueueKeys) -> None:
    worker = new_worker(fake, keys)
    stop = Stop()
    real_wait = stop.wait

    def wait(timeout: float | None = None) -> bool:
        stop.set()  # the stop arrives during the pause
        return real_wait(timeout)

    stop.wait = wait  # type: ignore[method-assign]
    calls = script(worker, stop, [redis.ConnectionError("refused"), True])
    worker.run(stop)  # type: ignore[arg-type]
    assert len(calls) == 1 and worker.dirty is True


# -- _deferred_failed --------------------------------------------------------------------------


def test_a_flushed_script_cache_resends_the_deferred_record(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    worker = new_worker(fake, keys)
    worker._deferred = ("EVAL", scripts.RECORD, 2, "k", "p", b"raw", "id", "v")
    with caplog.at_level(logging.INFO, logger=WORKER_LOG):
        assert worker._deferred_failed(redis.exceptions.NoScriptError("NOSCRIPT gone")) is True
    assert caplog.records == []  # nothing went wrong: the record is sent again in full


def test_a_noscript_with_nothing_deferred_is_only_logged(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    worker = new_worker(fake, keys)
    worker._deferred = ()
    with caplog.at_level(logging.INFO, logger=WORKER_LOG):
        assert worker._deferred_failed(redis.exceptions.NoScriptError("NOSCRIPT gone")) is False
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"worker {worker.list_key}: deferred command failed: NOSCRIPT gone")
    ]


def test_another_deferred_error_is_logged_and_not_resent(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    worker = new_worker(fake, keys)
    worker._deferred = ("EVAL", scripts.RECORD, 2, "k", "p", b"raw", "id", "v")
    with caplog.at_level(logging.INFO, logger=WORKER_LOG):
        assert worker._deferred_failed(redis.ResponseError("WRONGTYPE no")) is False
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"worker {worker.list_key}: deferred command failed: WRONGTYPE no")
    ]
