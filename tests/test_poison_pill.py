"""Poison pills: recovery counts what it takes back from dead holders, in the same step, and
dead-letters a task recovered more than `max_recoveries` times (docs/protocol.md, section 9)."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import redis

from taskcustody import ManualClock, Producer, QueueKeys, Server
from taskcustody.core.recovery import Recovering, drain_inflight, requeue_stuck_processing_tasks
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits, dead_letters, ids_in, make_server

LIMIT = 2
SETTINGS = dataclasses.replace(TEST_SETTINGS, max_recoveries=LIMIT)


def crashed_holder(client: redis.Redis, keys: QueueKeys, clock: ManualClock, n: int) -> Server:
    """Server `dead<n>` takes the next task and dies holding it (no release ran)."""
    server = make_server(client, keys, f"dead{n}", clock, settings=SETTINGS)
    (worker,) = server.start()
    # A task recovered before is a suspect: a new process sees the suspects list once a take
    # from the queue timed out (or a release told it), so the second take finds it.
    assert (worker.take(timeout=0.05) or worker.take(timeout=0.05)) is not None
    worker.close()
    return server


def counts(client: redis.Redis, keys: QueueKeys) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(keys.recoveries).items()}


def recover(client: redis.Redis, keys: QueueKeys, dead: Server, clock: ManualClock) -> int:
    """What a sweep does to a dead holder's list: drain it, counting."""
    return drain_inflight(
        client, keys, dead.list_keys()[0], force=True, recovering=Recovering(LIMIT, clock.now())
    )


def test_each_recovery_counts_the_task_and_names_the_holder_that_died(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("pill")
    first = crashed_holder(client, keys, clock, 1)
    assert recover(client, keys, first, clock) == 1
    # a counted task is a suspect: it waits on the suspects list, not the queue
    assert ids_in(client, keys.suspects) == [task_id] and client.llen(keys.queue) == 0
    assert counts(client, keys) == {task_id: "1", f"{task_id}:from": f"dead1#{first.incarnation}"}
    second = crashed_holder(client, keys, clock, 2)
    recover(client, keys, second, clock)
    assert counts(client, keys)[task_id] == "2"
    assert counts(client, keys)[f"{task_id}:from"] == (
        f"dead1#{first.incarnation},dead2#{second.incarnation}"
    )


def test_the_recovery_past_the_limit_dead_letters_the_task_in_the_same_step(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock(start=50.0)
    task_id = Producer(client, keys, clock).enqueue("pill")
    holders = []
    for n in range(LIMIT + 1):
        holders.append(crashed_holder(client, keys, clock, n))
        assert recover(client, keys, holders[-1], clock) == 1
    assert client.llen(keys.queue) == 0 and client.llen(holders[-1].list_keys()[0]) == 0
    (letter,) = dead_letters(client, keys)
    assert letter["poison"] is True and letter["task_id"] == task_id
    assert letter["recoveries"] == LIMIT + 1 and letter["at"] == 50.0
    assert letter["holders"] == ",".join(f"dead{n}#{h.incarnation}" for n, h in enumerate(holders))
    assert json.loads(base64.b64decode(letter["raw"]))["id"] == task_id
    assert "poison pill" in letter["error"]
    assert counts(client, keys) == {}  # the count went with it


def test_a_commit_deletes_the_count(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("fine after all")
    recover(client, keys, crashed_holder(client, keys, clock, 1), clock)
    (worker,) = make_server(client, keys, "healthy", clock, settings=SETTINGS).start()
    assert worker.run_once(timeout=0.05) is False  # the queue is empty; next: the suspects
    assert worker.run_once(timeout=0.05) is True
    assert commits(client, keys) == {task_id: 1} and counts(client, keys) == {}


def test_a_retry_keeps_the_count_and_a_final_failure_deletes_it(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("fails")

    def fail(payload: Any) -> None:
        raise RuntimeError("no")

    recover(client, keys, crashed_holder(client, keys, clock, 1), clock)
    (worker,) = make_server(client, keys, "healthy", clock, fail, settings=SETTINGS).start()
    assert worker.run_once(timeout=0.05) is False  # the queue is empty; next: the suspects
    assert worker.run_once(timeout=0.05) is True  # attempt 1: retried
    assert counts(client, keys)[task_id] == "1"
    # a task with a count is retried as a suspect: it still runs alone
    assert ids_in(client, keys.suspects) == [task_id] and client.llen(keys.queue) == 0
    for _ in range(SETTINGS.max_attempts - 1):
        worker.run_once(timeout=0.05)
    assert [d["task_id"] for d in dead_letters(client, keys)] == [task_id]
    assert counts(client, keys) == {}


def test_the_processing_sweep_counts_and_dead_letters_too(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("pill")
    client.hset(keys.recoveries, task_id, LIMIT)  # recovered LIMIT times already
    server = make_server(client, keys, "dead", clock, settings=SETTINGS)
    (worker,) = server.start()
    task = worker.take(timeout=0.05)
    assert task is not None
    worker.record(task)
    worker.flush()
    worker.close()
    server.deregister()  # its owner is not live any more
    me = make_server(client, keys, "sweeper", clock, settings=SETTINGS)
    me.claim()
    assert requeue_stuck_processing_tasks(
        client, keys, me.identity, Recovering(LIMIT, clock.now())
    ) == (0, 0)
    assert [d["task_id"] for d in dead_letters(client, keys) if d.get("poison")] == [task_id]
    assert client.llen(keys.queue) == 0 and client.llen(worker.list_key) == 0


def test_without_a_limit_recovery_counts_nothing(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    dead = crashed_holder(client, keys, clock, 1)
    drain_inflight(client, keys, dead.list_keys()[0], force=True)  # Recovering() counts nothing
    assert counts(client, keys) == {} and client.llen(keys.queue) == 1
    assert client.llen(keys.suspects) == 0


def test_a_worker_restarted_with_debris_counts_what_it_reconciles(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("x")
    (worker,) = make_server(client, keys, "s1", clock, settings=SETTINGS).start()
    assert worker.take(timeout=0.05) is not None  # ... and the worker dies without its finally
    worker.dirty = True
    worker.reconcile()
    assert counts(client, keys)[task_id] == "1"
