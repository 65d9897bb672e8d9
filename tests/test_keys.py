"""The key schema (`QueueKeys`): an in-flight list's key names its owner and reads back to it, a
key of another queue is refused by name, and the map of fixed keys to Redis types is exact and is
what a live queue creates."""

from __future__ import annotations

import re
from typing import Any

import pytest

from taskcustody import InvalidName, ListOwner, ManualClock, Producer, QueueKeys, Settings
from tests.conftest import Backend
from tests.helpers import make_server


def test_owner_of_accepts_bytes_and_str(keys: QueueKeys) -> None:
    owner = ListOwner("srv-1", 7, "w.3")
    key = keys.inflight(owner)
    assert keys.owner_of(key) == owner
    assert keys.owner_of(key.encode()) == owner


def test_owner_of_names_the_foreign_key(keys: QueueKeys) -> None:
    other = QueueKeys("other", prefix="test").inflight(ListOwner("s", 1, "w"))
    expected = f"{other!r} is not an in-flight list of queue 'tq'"
    with pytest.raises(InvalidName, match=f"^{re.escape(expected)}$"):
        keys.owner_of(other)
    with pytest.raises(InvalidName, match=f"^{re.escape(expected)}$"):
        keys.owner_of(other.encode())


def test_all_fixed_keys_is_the_exact_type_map(keys: QueueKeys) -> None:
    assert keys.all_fixed_keys() == {
        "test:{tq}:queue": "list",
        "test:{tq}:suspects": "list",
        "test:{tq}:scheduled": "zset",
        "test:{tq}:inflight-registry": "zset",
        "test:{tq}:inflight-lists": "set",
        "test:{tq}:servers": "zset",
        "test:{tq}:incarnations": "hash",
        "test:{tq}:processing": "hash",
        "test:{tq}:recoveries": "hash",
        "test:{tq}:dead": "list",
        "test:{tq}:committed": "string",
        "test:{tq}:commits": "hash",
        "test:{tq}:sweep-lease": "string",
    }


def test_all_fixed_keys_match_the_types_a_live_queue_creates(
    backend: Backend, keys: QueueKeys
) -> None:
    """Every fixed key, once the queue has used it, holds exactly the type the map names."""
    client = backend.client()
    clock = ManualClock()
    producer = Producer(client, keys, clock)
    producer.enqueue_many(["ok", "fail", "later", "suspect", "waiting"])

    def handler(payload: Any) -> str:
        if payload == "fail":
            raise RuntimeError("no")
        return "done"

    # max_attempts=2 with a retry delay: the failing task waits in the scheduled set; a malformed
    # entry, taken first, is dead-lettered.
    client.rpush(keys.queue, "not json")
    settings = Settings(
        block_timeout=0.05,
        socket_timeout_margin=2.0,
        heartbeat_interval=5,
        server_ttl=15,
        max_attempts=2,
        drain_chunk=3,
        track_commits=True,
        retry_backoff=1.0,
    )
    server = make_server(client, keys, "s1", clock, handler=handler, settings=settings)
    server.claim()
    assert server.sweep_lease.acquire_or_renew()
    worker = server.make_worker(0)
    worker.register()
    try:
        assert worker.take() is None  # the malformed entry: a dead letter
        assert worker.run_once() is True
        assert worker.run_once() is True
        # two tasks whose holder dies: its restart reconciles them (counted recoveries: suspects)
        assert worker.take() is not None
        assert worker.take() is not None
        worker.reconcile()  # ... and the next take takes one of them, the other one waits
        task = worker.take()
        assert task is not None
        worker.record(task)
        worker.flush()
    finally:
        worker.close()
    # The version 0.1 registry exists only where 0.1 ran; a starting server migrates it away.
    client.sadd(keys.legacy_inflight_registry, "left-by-0.1")
    for key, want in keys.all_fixed_keys().items():
        assert client.type(key) == want.encode(), key
