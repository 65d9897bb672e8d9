"""`get_result` (and `taskcustody result`) of an id that is nowhere in the queue fails at once with
UnknownTask, from one atomic look; an id that is somewhere -- queued, in flight, scheduled, a
suspect, dead-lettered, committed -- is never reported unknown, even while it moves.

Time is injected: a waiter that waited would have slept through `Sleeper` and moved its clock."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from taskcustody import (
    ManualClock,
    Producer,
    QueueKeys,
    ResultTimeout,
    TaskCustodyError,
    TaskFailed,
    UnknownTask,
    connect,
    get_result,
)
from taskcustody.cli.app import main
from taskcustody.core.envelope import new_task
from taskcustody.ops.results import DEAD_WINDOW, QUEUE_WINDOW
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import make_server
from tests.support.redis_cluster import LocalCluster
from tests.support.redis_server import RedisServerProcess


class Sleeper:
    """An injected sleep that records each pause and moves the injected clock by it."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.start = clock.now()
        self.pauses: list[float] = []

    @property
    def waited(self) -> bool:
        return bool(self.pauses) or self.clock.now() != self.start

    def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.clock.advance(seconds)


def wait(
    client: redis.Redis, keys: QueueKeys, task_id: str, timeout: float = 60
) -> tuple[Any, Sleeper]:
    """`get_result` on injected time: (what it returned or raised, the sleeper)."""
    clock = ManualClock()
    sleep = Sleeper(clock)
    try:
        return get_result(client, keys, task_id, timeout, clock=clock, sleep=sleep), sleep
    except TaskCustodyError as exc:
        return exc, sleep


def fail(payload: object) -> None:
    raise RuntimeError(f"failed on {payload!r}")


def busy_queue(client: redis.Redis, keys: QueueKeys) -> None:
    """Other tasks in every place but the queue (a dead letter, one in flight, a scheduled
    retry, a suspect), so that a look has something to look through; the queue is left as it
    was."""
    producer = Producer(client, keys, ManualClock())
    (worker,) = make_server(client, keys, "busy", ManualClock(), fail).start()
    try:
        producer.enqueue("other doomed")
        for _ in range(TEST_SETTINGS.max_attempts):
            assert worker.run_once(timeout=0.05)
        producer.enqueue("other running")
        assert worker.take(timeout=0.05) is not None  # left in flight
    finally:
        worker.close()
    client.zadd(keys.scheduled, {new_task("other scheduled", 0.0).raw: 99.0})
    client.lpush(keys.suspects, new_task("other suspect", 0.0).raw)
    assert client.llen(keys.dead_letters) == 1


def other_queued(client: redis.Redis, keys: QueueKeys) -> None:
    Producer(client, keys).enqueue_many([f"other queued {i}" for i in range(5)])


def test_a_never_enqueued_id_fails_at_once_without_waiting(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    busy_queue(client, keys)
    other_queued(client, keys)
    raised, sleep = wait(client, keys, "never-enqueued", timeout=60)
    assert isinstance(raised, UnknownTask) and isinstance(raised, LookupError), raised
    assert (raised.task_id, raised.queue_name) == ("never-enqueued", keys.queue_name)
    assert str(raised).startswith(
        f"no task never-enqueued in queue {keys.queue_name!r}: it is "
        "not queued, scheduled, in flight or dead-lettered"
    )
    assert not sleep.waited  # not one pause


def test_an_id_of_another_queue_or_prefix_is_unknown_here(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    task_id = Producer(client, keys).enqueue("mine")
    for elsewhere in (QueueKeys("other", keys.prefix), QueueKeys(keys.queue_name, "elsewhere")):
        raised, sleep = wait(client, elsewhere, task_id)
        assert isinstance(raised, UnknownTask) and not sleep.waited


# -- an id that is somewhere is never unknown ---------------------------------------------------


def _queued_deep(client: redis.Redis, keys: QueueKeys) -> str:
    """Older than the newest QUEUE_WINDOW queued tasks, which the first poll reads: found by
    the look."""
    task_id = Producer(client, keys).enqueue("deep")
    Producer(client, keys).enqueue_many(list(range(QUEUE_WINDOW + 5)))
    return task_id


def _queued_recent(client: redis.Redis, keys: QueueKeys) -> str:
    """Among the newest QUEUE_WINDOW: found by the first poll, without the look."""
    return Producer(client, keys).enqueue("recent")


def _in_flight(client: redis.Redis, keys: QueueKeys) -> str:
    task_id = Producer(client, keys).enqueue("running")
    (worker,) = make_server(client, keys, "s1", ManualClock()).start()
    task = worker.take(timeout=0.05)
    worker.close()
    assert task is not None and task.id == task_id
    return task_id


def _in_a_version_0_1_list(client: redis.Redis, keys: QueueKeys) -> str:
    """In a list only the registry of version 0.1 (a set) names, not yet migrated."""
    task = new_task("old", 0.0)
    list_key = f"{keys.inflight_prefix}old-server:1:w0"
    client.sadd(keys.legacy_inflight_registry, list_key)
    client.lpush(list_key, task.raw)
    return task.id


def _scheduled(client: redis.Redis, keys: QueueKeys) -> str:
    """A failed attempt waiting out its retry delay in the scheduled set."""
    task_id = Producer(client, keys).enqueue("retry later")
    settings = dataclasses.replace(TEST_SETTINGS, retry_backoff=60.0, retry_backoff_max=60.0)
    (worker,) = make_server(client, keys, "s1", ManualClock(), fail, settings=settings).start()
    assert worker.run_once(timeout=0.05)
    worker.close()
    assert any(task_id.encode() in raw for raw in client.zrange(keys.scheduled, 0, -1))
    return task_id


def _suspect(client: redis.Redis, keys: QueueKeys) -> str:
    """Recovered from a holder that died: on the suspects list (as DRAIN_CHUNK leaves it)."""
    task = new_task("suspect", 0.0)
    client.hset(keys.recoveries, task.id, 1)
    client.lpush(keys.suspects, task.raw)
    return task.id


def _committed_without_a_result(client: redis.Redis, keys: QueueKeys) -> str:
    """Committed by a worker that keeps no results (result_ttl 0), counted (track_commits)."""
    task_id = Producer(client, keys).enqueue("no result kept")
    settings = dataclasses.replace(TEST_SETTINGS, result_ttl=0)
    (worker,) = make_server(client, keys, "s1", ManualClock(), settings=settings).start()
    assert worker.run_once(timeout=0.05)
    worker.close()
    return task_id


PENDING: dict[str, Callable[[redis.Redis, QueueKeys], str]] = {
    "queued-deep": _queued_deep,
    "queued-recent": _queued_recent,
    "in-flight": _in_flight,
    "in-a-version-0.1-list": _in_a_version_0_1_list,
    "scheduled": _scheduled,
    "suspect": _suspect,
    "committed-without-a-result": _committed_without_a_result,
}


@pytest.mark.parametrize("place", list(PENDING))
def test_an_id_that_is_somewhere_is_not_reported_unknown(
    backend: Backend, keys: QueueKeys, place: str
) -> None:
    client = backend.client()
    busy_queue(client, keys)  # first: it takes from the queue, which must not hold ours yet
    task_id = PENDING[place](client, keys)
    other_queued(client, keys)
    raised, _ = wait(client, keys, task_id, timeout=0)
    assert isinstance(raised, ResultTimeout), raised  # looked, found it, waited the timeout out


def test_a_committed_id_returns_its_result(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    task_id = Producer(client, keys).enqueue(20)
    (worker,) = make_server(client, keys, "s1", ManualClock(), lambda p: p + 1).start()
    assert worker.run_once(timeout=0.05)
    worker.close()
    assert wait(client, keys, task_id)[0] == 21


def test_a_failure_buried_under_newer_dead_letters_is_reported_at_once(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    task_id = Producer(client, keys).enqueue("doomed")
    (worker,) = make_server(client, keys, "s1", ManualClock(), fail).start()
    for _ in range(TEST_SETTINGS.max_attempts):
        worker.run_once(timeout=0.05)
    worker.close()
    client.lpush(
        keys.dead_letters,
        *[
            json.dumps({"raw": "", "error": "other", "task_id": str(i), "at": 0})
            for i in range(DEAD_WINDOW + 5)
        ],
    )
    raised, sleep = wait(client, keys, task_id, timeout=60)
    assert isinstance(raised, TaskFailed) and "failed on 'doomed'" in str(raised), raised
    assert not sleep.waited  # the look read every dead letter: no waiting for the timeout


class LateRegistration:
    """A client whose task is taken, into a list registered only now, between the first poll
    (which read the registry) and the look: the look's own read of the registry must catch the
    list it did not know."""

    def __init__(self, client: redis.Redis, keys: QueueKeys) -> None:
        self._client = client
        self._keys = keys
        self.looks = 0
        self.list_key = f"{keys.inflight_prefix}late-server:1:w0"

    def pipeline(self, transaction: bool = True) -> Any:
        if transaction:
            self.looks += 1
            if self.looks == 1:  # as a take does: register the list, then move into it
                self._client.zadd(self._keys.inflight_registry, {self.list_key: 0})
                self._client.lmove(self._keys.queue, self.list_key, "RIGHT", "LEFT")
        return self._client.pipeline(transaction=transaction)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_task_taken_into_a_list_registered_after_the_first_poll_is_not_unknown(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    task_id = _queued_deep(client, keys)  # the oldest: the next one taken
    late = LateRegistration(client, keys)
    raised, _ = wait(late, keys, task_id, timeout=0)  # type: ignore[arg-type]
    assert client.lrange(late.list_key, 0, -1)[0].decode().find(task_id) > 0  # it moved
    assert isinstance(raised, ResultTimeout), raised
    assert late.looks == 2  # the first look saw a list it had not read, and looked again


# -- the command ------------------------------------------------------------------------------


@pytest.mark.real_redis
def test_cli_result_of_a_never_enqueued_id_says_so_in_one_line_at_once(
    real_redis: RedisServerProcess,
) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    keys = QueueKeys("cli-unknown")
    busy_queue(client, keys)
    other_queued(client, keys)
    common = ["--queue", keys.queue_name, "--redis-url", real_redis.url]
    out = CliRunner().invoke(main, ["result", "never-enqueued", "--timeout", "30", *common])
    assert out.exit_code == 1, out.output
    assert out.output.strip() == (
        "Error: no task never-enqueued in queue 'cli-unknown': it is not queued, scheduled, in "
        "flight or dead-lettered, and no result is stored (never enqueued on this queue, or its "
        "result expired or was not kept: result_ttl)"
    )
    queued = _queued_deep(client, keys)
    late = CliRunner().invoke(main, ["result", queued, "--timeout", "0", *common])
    assert late.exit_code == 1 and "no result for task" in late.output, late.output
    help_text = CliRunner().invoke(main, ["result", "--help"]).output
    assert "exit 1 at once" in " ".join(help_text.split())


@pytest.mark.cluster
def test_the_look_is_one_transaction_on_a_redis_cluster_too(local_cluster: LocalCluster) -> None:
    client = connect(local_cluster.url(0))
    keys = QueueKeys("unknown-look", prefix="test-cluster")
    try:
        busy_queue(client, keys)
        in_flight = _in_flight(client, keys)
        other_queued(client, keys)
        raised, sleep = wait(client, keys, "never-enqueued")
        assert isinstance(raised, UnknownTask) and not sleep.waited
        assert isinstance(wait(client, keys, in_flight, timeout=0)[0], ResultTimeout)
    finally:  # the cluster is the session's: leave it as found
        for key in list(client.scan_iter(match=f"{keys.base}:*")):
            client.delete(key)


def test_a_submitted_tasks_handle_skips_the_look_a_handle_made_by_hand_does_not(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    handle = Producer(client, keys).submit("kept")
    client.delete(keys.queue)  # as if it committed and its result expired
    clock = ManualClock()
    with pytest.raises(ResultTimeout):  # its producer enqueued it: waited, as before
        handle.result(timeout=3, clock=clock, sleep=Sleeper(clock))
    by_hand = dataclasses.replace(handle, enqueued=False)
    with pytest.raises(UnknownTask):
        by_hand.result(timeout=3, clock=clock, sleep=Sleeper(clock))
