"""A release Redis refuses writes nothing: the task stays in its worker's in-flight list, with its
processing record, not counted as committed (docs/protocol.md, section 2, "A refused release").

Redis never rolls a script back: a command it refuses half-way leaves the writes before it done.
The release used to remove the task from the list and count it committed before the SET of its
result, which Redis refuses for an expiry past its range ("invalid expire time in 'set' command").
The refusals here are injected on a real redis-server: a worker whose settings carry a value past
what Redis accepts (set behind Settings' back, which would refuse it), or the script called with
such an argument.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from taskcustody import (
    AsyncWorker,
    ListOwner,
    ManualClock,
    Producer,
    QueueKeys,
    ReleaseRefused,
    Settings,
    connect,
    connect_async,
    get_result,
)
from taskcustody.core import scripts
from taskcustody.core.outcome import Outcome
from taskcustody.core.scripts import MAX_RESULT_TTL
from taskcustody.core.worker import Worker
from taskcustody.deploy.release_refusals import RefusedReleases, as_refused
from tests.conftest import TEST_SETTINGS
from tests.helpers import Stop, all_custody, ids_in, make_server
from tests.support.redis_server import RedisServerProcess

#: The reported value: past LLONG_MAX / 1000, so Redis refuses `SET ... EX` with it.
REPORTED_TTL = 99_999_999_999_999_999


def unchecked(settings: Settings, **fields: Any) -> Settings:
    """`settings` with `fields` set behind Settings' back (it would refuse them): what reaches
    the scripts when a value Redis refuses gets past the settings."""
    copy = dataclasses.replace(settings)
    for name, value in fields.items():
        object.__setattr__(copy, name, value)
    return copy


@pytest.fixture
def client(real_redis: RedisServerProcess) -> Iterator[redis.Redis]:
    c = connect(real_redis.url, TEST_SETTINGS)
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def keys() -> QueueKeys:
    return QueueKeys("refused", prefix="test")


def started_worker(
    client: redis.Redis,
    keys: QueueKeys,
    settings: Settings,
    handler: Any = lambda p: {"doubled": 2 * p["n"]},
) -> Worker:
    (worker,) = make_server(client, keys, "s1", ManualClock(), handler, settings=settings).start()
    assert isinstance(worker, Worker)
    return worker


def snapshot(client: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key and its serialised value: equal snapshots, equal data."""
    return {key: client.dump(key) for key in sorted(client.keys("*"))}


def test_a_release_whose_result_ttl_redis_refuses_writes_nothing(
    client: redis.Redis, keys: QueueKeys
) -> None:
    worker = started_worker(client, keys, unchecked(TEST_SETTINGS, result_ttl=REPORTED_TTL))
    task_id = Producer(client, keys).enqueue({"n": 1})
    task = worker.take(timeout=0.05)
    assert task is not None and task.id == task_id
    worker.record(task)
    worker.flush()
    before = snapshot(client)
    with pytest.raises(redis.ResponseError) as refused:
        worker.release(task, worker.execute(task))
    assert snapshot(client) == before
    assert re.search("release refused before any write", str(refused.value)), refused.value
    # in custody: in the worker's list, its record naming that list; not committed, no result
    assert client.lrange(worker.list_key, 0, -1) == [task.raw]
    assert client.hget(keys.processing, task_id).decode().startswith(worker.list_key + " ")
    assert client.get(keys.committed) is None and client.hlen(keys.commit_log) == 0
    assert client.exists(keys.result(task_id)) == 0
    worker.close()


def test_a_release_and_take_whose_result_ttl_redis_refuses_writes_nothing_and_takes_nothing(
    client: redis.Redis, keys: QueueKeys
) -> None:
    worker = started_worker(client, keys, unchecked(TEST_SETTINGS, result_ttl=REPORTED_TTL))
    first, second = Producer(client, keys).enqueue_many([{"n": 1}, {"n": 2}])
    task = worker.take(timeout=0.05)
    assert task is not None and task.id == first
    worker.record(task)
    worker.flush()
    before = snapshot(client)
    with pytest.raises(redis.ResponseError) as refused:
        worker.release_and_take(task, Outcome(True, {"r": 1}))
    assert snapshot(client) == before
    assert re.search("release refused before any write", str(refused.value)), refused.value
    assert client.lrange(worker.list_key, 0, -1) == [task.raw]
    assert ids_in(client, keys.queue) == [second]  # the next task was not taken
    worker.close()


def release_args_with(
    worker: Worker, raw: bytes, task_id: str, action: str, data: str, position: int, value: Any
) -> tuple[Any, ...]:
    args = list(worker.release_args(raw, task_id, action, data))
    args[position] = value
    return tuple(args)


#: Where the result TTL and the due time sit in RELEASE's arguments (numkeys, 10 keys, argv).
TTL_ARG, DUE_ARG = 15, 17


def test_a_delayed_retry_whose_due_time_redis_refuses_writes_nothing(
    client: redis.Redis, keys: QueueKeys
) -> None:
    """ZADD refuses a NaN score: without the check the task left the list and reached neither
    the scheduled set nor the queue (lost)."""
    worker = started_worker(client, keys, TEST_SETTINGS)
    Producer(client, keys).enqueue({"n": 1})
    task = worker.take(timeout=0.05)
    assert task is not None
    worker.record(task)
    worker.flush()
    retried = task.retried().raw.decode()
    args = release_args_with(worker, task.raw, task.id, "later", retried, DUE_ARG, "nan")
    assert worker.release_args(task.raw, task.id, "later", retried)[TTL_ARG] == 86_400
    before = snapshot(client)
    with pytest.raises(redis.ResponseError) as refused:
        client.eval(scripts.RELEASE, *args)
    assert snapshot(client) == before
    assert re.search("due time nan is not a number", str(refused.value)), refused.value
    assert client.lrange(worker.list_key, 0, -1) == [task.raw]
    worker.close()


@pytest.mark.parametrize("ttl", [MAX_RESULT_TTL + 1, 0, -5, "1.5", "1e3", "01", ""])
def test_the_release_refuses_a_result_ttl_past_the_bound_before_any_write(
    client: redis.Redis, keys: QueueKeys, ttl: Any
) -> None:
    """One past the bound: Redis itself would take 10**15 + 1 (its own limit is some 9.2e15),
    but Settings refuses it, and so does the script, exactly there (a Lua number holds 10**15 +
    1 exactly). The other values are what SET EX refuses: not a positive whole number."""
    worker = started_worker(client, keys, TEST_SETTINGS)
    Producer(client, keys).enqueue({"n": 1})
    task = worker.take(timeout=0.05)
    assert task is not None
    worker.record(task)
    worker.flush()
    args = release_args_with(worker, task.raw, task.id, "ok", '"r"', TTL_ARG, ttl)
    before = snapshot(client)
    with pytest.raises(redis.ResponseError) as refused:
        client.eval(scripts.RELEASE, *args)
    assert snapshot(client) == before
    assert re.search("release refused before any write", str(refused.value)), refused.value
    worker.close()


def test_a_release_at_the_result_ttl_bound_commits_and_keeps_the_result_that_long(
    client: redis.Redis, keys: QueueKeys
) -> None:
    worker = started_worker(
        client, keys, dataclasses.replace(TEST_SETTINGS, result_ttl=MAX_RESULT_TTL)
    )
    task_id = Producer(client, keys).enqueue({"n": 21})
    assert worker.run_once(timeout=0.05)
    assert get_result(client, keys, task_id, timeout=0) == {"doubled": 42}
    assert client.ttl(keys.result(task_id)) == 10**15
    assert int(client.get(keys.committed)) == 1
    worker.close()


def test_redis_takes_the_bound_and_refuses_the_reported_ttl_in_set_ex(
    client: redis.Redis,
) -> None:
    """The bound is inside what Redis accepts; the reported value is not (what the release used
    to run into half-way)."""
    assert client.set("probe", "x", ex=MAX_RESULT_TTL)
    with pytest.raises(redis.ResponseError, match="invalid expire time"):
        client.set("probe", "x", ex=REPORTED_TTL)


# -- the worker: a refused release is a back-off and one log line, not a crash per task --------

WORKER_LOG = "taskcustody.worker"
REFUSED_LINE = "Redis refused a release"


def lines(caplog: pytest.LogCaptureFixture, logger: str, fragment: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == logger and fragment in r.getMessage()
    ]


def assert_in_custody_uncommitted(client: redis.Redis, keys: QueueKeys, task_id: str) -> None:
    """The task is held once (in a list, the queue or the suspects list), and nothing says it
    committed: no count, no result."""
    __tracebackhide__ = True
    assert all_custody(client, keys) == {task_id: 1}
    assert client.get(keys.committed) is None and client.hlen(keys.commit_log) == 0
    assert client.exists(keys.result(task_id)) == 0


@pytest.mark.parametrize("prefetch", [1, 2])
def test_a_worker_whose_releases_redis_refuses_backs_off_and_logs_once_not_crashing(
    client: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture, prefetch: int
) -> None:
    """Before: every refused release left the worker loop, and the server's supervisor logged
    "crashed; restarting it" with a traceback, once per task. The supervisor runs the loop here
    with an injected stop event, which stops it at its fourth pause."""
    runs: list[Any] = []
    settings = unchecked(
        dataclasses.replace(TEST_SETTINGS, prefetch=prefetch), result_ttl=REPORTED_TTL
    )
    server = make_server(client, keys, "s1", ManualClock(), runs.append, settings=settings)
    (runner,) = server.start()
    task_id = Producer(client, keys).enqueue({"n": 1})
    stop = Stop(lambda n: stop.set() if n == 4 else None)
    server.stop_event = stop  # type: ignore[assignment]
    caplog.set_level(logging.INFO)
    server._supervise(runner, until_idle=False)
    assert not lines(caplog, "taskcustody.server", "crashed")
    # one line for four refusals: the clock did not move, and the refusal's text did not change
    refused = lines(caplog, WORKER_LOG, REFUSED_LINE)
    assert len(refused) == 1, refused
    assert "release refused before any write" in refused[0]
    # backed off: the OOM spell's pauses, doubled from min(1 s, block_timeout) per refusal
    assert stop.waits == [0.05, 0.1, 0.2, 0.4]
    # the handler ran once per cycle, and its task was never lost nor counted committed
    assert len(runs) == 4
    assert_in_custody_uncommitted(client, keys, task_id)
    runner.close()


def test_a_refusal_is_logged_again_when_its_text_changes_or_its_interval_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    spell = RefusedReleases(logging.getLogger(WORKER_LOG), "worker w", clock, interval=30)
    caplog.set_level(logging.INFO)
    spell.refused(ReleaseRefused("a"))
    spell.refused(ReleaseRefused("a"))
    spell.refused(ReleaseRefused("b"))  # another error: said at once
    clock.advance(29)
    spell.refused(ReleaseRefused("b"))
    clock.advance(1)
    spell.refused(ReleaseRefused("b"))  # the interval passed
    spell.recovered()
    said = [r.getMessage() for r in caplog.records if r.name == WORKER_LOG]
    assert [m.split("(")[1].split(")")[0] for m in said[:3]] == ["a", "b", "b"]
    assert said[3] == "worker w: Redis accepts releases again after 5 refusal(s)"
    assert len(said) == 4


def test_only_a_release_error_that_is_neither_oom_nor_a_redirect_is_a_refusal() -> None:
    oom = redis.exceptions.OutOfMemoryError("OOM command not allowed when used memory")
    moved = redis.exceptions.MovedError("1 127.0.0.1:7000")
    plain = redis.ResponseError("ERR release refused before any write: ...")
    assert as_refused(oom) is oom and as_refused(moved) is moved
    refused = as_refused(plain)
    assert isinstance(refused, ReleaseRefused) and isinstance(refused, redis.ResponseError)
    assert str(refused) == str(plain)


def test_an_async_worker_whose_releases_redis_refuses_backs_off_and_logs_once(
    real_redis: RedisServerProcess,
    client: redis.Redis,
    keys: QueueKeys,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The asyncio loop, likewise. Its pauses are real (asyncio), a few 0.05 s: the handler
    stops the loop at its third run, so the third refusal ends it, with no timing involved."""
    settings = unchecked(TEST_SETTINGS, result_ttl=REPORTED_TTL)
    task_id = Producer(client, keys).enqueue({"n": 1})
    caplog.set_level(logging.INFO)

    async def main() -> int:
        aclient = connect_async(real_redis.url, settings)
        stop = asyncio.Event()
        runs: list[Any] = []

        def handler(payload: Any) -> None:
            runs.append(payload)
            if len(runs) == 3:
                stop.set()

        worker = AsyncWorker(
            aclient, keys, ListOwner("s1", 1, "w0"), handler, ManualClock(), settings
        )
        try:
            await worker.run(stop)  # raises, before: the refusal left the loop
        finally:
            await worker.close()
            await aclient.aclose()
        return len(runs)

    assert asyncio.run(main()) == 3
    refused = lines(caplog, WORKER_LOG, REFUSED_LINE)
    assert len(refused) == 1, refused
    assert_in_custody_uncommitted(client, keys, task_id)
