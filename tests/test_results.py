"""Results: submit returns a handle, get_result blocks (polling with a bounded backoff on injected
time) until the task commits, fails or the timeout passes; `taskcustody result` does the same."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from click.testing import CliRunner

from taskcustody import (
    ManualClock,
    Producer,
    QueueKeys,
    ResultTimeout,
    TaskFailed,
    TaskHandle,
    Worker,
    get_result,
)
from taskcustody.cli.app import main
from taskcustody.ops.results import DEAD_WINDOW, FIRST_PAUSE, MAX_PAUSE
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import make_server
from tests.support.redis_server import RedisServerProcess


class Sleeper:
    """An injected sleep: advances the injected clock, records each pause, and may run a step
    (a worker cycle) at a given pause, as if it happened while the caller slept."""

    def __init__(
        self, clock: ManualClock, at: int | None = None, step: Callable[[], object] | None = None
    ) -> None:
        self.clock = clock
        self.pauses: list[float] = []
        self.at = at
        self.step = step

    def __call__(self, seconds: float) -> None:
        assert seconds >= 0
        self.pauses.append(seconds)
        self.clock.advance(seconds)
        if self.step is not None and len(self.pauses) == self.at:
            self.step()


def worker_for(
    client: redis.Redis, keys: QueueKeys, handler: Callable[[object], object], name: str = "s1"
) -> Worker:
    (worker,) = make_server(client, keys, name, ManualClock(), handler).start()
    return worker  # type: ignore[return-value]


def test_submit_returns_a_handle_whose_result_is_the_handlers_return_value(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    handle = Producer(client, keys).submit({"x": 2})
    assert isinstance(handle, TaskHandle) and len(handle.id) == 32
    worker = worker_for(client, keys, lambda p: {"doubled": p["x"] * 2})  # type: ignore[index]
    assert worker.run_once(timeout=0.05)
    worker.close()
    assert handle.result(timeout=0) == {"doubled": 4}
    assert get_result(client, keys, handle.id, timeout=0) == {"doubled": 4}


def test_a_handler_returning_none_gives_none_not_a_timeout(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    handle = Producer(client, keys).submit(1)
    worker = worker_for(client, keys, lambda p: None)
    assert worker.run_once(timeout=0.05)
    worker.close()
    assert handle.result(timeout=0) is None


def test_get_result_waits_with_a_bounded_backoff_until_the_task_commits(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    handle = Producer(client, keys).submit("late")
    worker = worker_for(client, keys, lambda p: f"{p} but done")
    clock = ManualClock()
    sleep = Sleeper(clock, at=10, step=lambda: worker.run_once(timeout=0.05))
    assert handle.result(timeout=60, clock=clock, sleep=sleep) == "late but done"
    worker.close()
    # It slept between polls (never a busy loop), doubling from FIRST_PAUSE up to MAX_PAUSE,
    # and returned at the first poll after the commit.
    assert len(sleep.pauses) == 10
    assert sleep.pauses[0] == FIRST_PAUSE
    assert all(
        b == min(2 * a, MAX_PAUSE) for a, b in zip(sleep.pauses, sleep.pauses[1:], strict=False)
    )
    assert max(sleep.pauses) == MAX_PAUSE


def test_get_result_times_out_at_the_timeout_not_after_it(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    handle = Producer(client, keys).submit("never run")
    clock = ManualClock()
    sleep = Sleeper(clock)
    with pytest.raises(ResultTimeout, match=f"no result for task {handle.id} within 5 s"):
        handle.result(timeout=5, clock=clock, sleep=sleep)
    assert sum(sleep.pauses) == pytest.approx(5)  # the last pause is cut to the deadline
    assert max(sleep.pauses) <= MAX_PAUSE


def test_a_dead_lettered_task_raises_task_failed_with_its_error(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    handle = Producer(client, keys).submit("doomed")

    def fail(payload: object) -> None:
        raise RuntimeError("no luck")

    worker = worker_for(client, keys, fail)
    clock = ManualClock()

    def fail_every_attempt() -> None:
        for _ in range(TEST_SETTINGS.max_attempts):
            worker.run_once(timeout=0.05)

    sleep = Sleeper(clock, at=3, step=fail_every_attempt)
    with pytest.raises(
        TaskFailed,
        match=r"after 3 attempt\(s\) and was dead-lettered: "
        r"RuntimeError: no luck",
    ) as failed:
        handle.result(timeout=60, clock=clock, sleep=sleep)
    worker.close()
    assert failed.value.task_id == handle.id and failed.value.attempts == 3
    assert len(sleep.pauses) == 3  # seen at the first poll after it failed, not at the timeout


def test_a_failure_buried_under_newer_dead_letters_is_still_reported_at_the_timeout(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    handle = Producer(client, keys).submit("doomed")

    def fail(payload: object) -> None:
        raise RuntimeError("no luck")

    worker = worker_for(client, keys, fail)
    for _ in range(TEST_SETTINGS.max_attempts):
        worker.run_once(timeout=0.05)
    worker.close()
    # More newer dead letters than a poll reads.
    client.lpush(
        keys.dead_letters,
        *[
            json.dumps({"raw": "", "error": "other", "task_id": str(i), "at": 0})
            for i in range(DEAD_WINDOW + 5)
        ],
    )
    clock = ManualClock()
    with pytest.raises(TaskFailed, match="no luck"):
        handle.result(timeout=2, clock=clock, sleep=Sleeper(clock))
    assert clock.now() == pytest.approx(1_002)


def test_timeout_zero_looks_once(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    queued = Producer(client, keys).enqueue("waits")
    clock = ManualClock()
    sleep = Sleeper(clock)
    with pytest.raises(ResultTimeout):
        get_result(client, keys, queued, timeout=0, clock=clock, sleep=sleep)
    assert sleep.pauses == []


@pytest.mark.real_redis
def test_cli_result_prints_the_json_result_or_fails_in_one_line(
    real_redis: RedisServerProcess,
) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    keys = QueueKeys("cli")
    done = Producer(client, keys).submit({"n": 1})
    worker = worker_for(client, keys, lambda p: {"got": p})
    assert worker.run_once(timeout=0.05)
    worker.close()
    common = ["--queue", "cli", "--redis-url", real_redis.url]
    out = CliRunner().invoke(main, ["result", done.id, "--timeout", "0", *common])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"got": {"n": 1}}
    pending = Producer(client, keys).submit("pending")
    late = CliRunner().invoke(main, ["result", pending.id, "--timeout", "0.05", *common])
    assert late.exit_code == 1
    assert late.output.strip() == (
        f"Error: no result for task {pending.id} within 0.05 s: it "
        "is still queued or running, or its result expired "
        "(result_ttl), or no such task committed"
    )
