"""The producer's batching: `enqueue_many` sends one LPUSH per batch (10,000 tasks by default,
or `batch_size`), and every task gets an id of its own."""

from __future__ import annotations

from typing import Any

import pytest

from taskcustody import ManualClock, Producer, QueueKeys
from tests.conftest import Backend


def test_enqueue_many_sends_one_lpush_per_10000_tasks(backend: Backend, keys: QueueKeys) -> None:
    if backend.real:
        pytest.skip("batching is client-side; one backend suffices")
    client = backend.client()
    sizes: list[int] = []
    original = client.lpush

    def counting(name: str, *values: Any) -> Any:
        sizes.append(len(values))
        return original(name, *values)

    client.lpush = counting  # type: ignore[method-assign]
    ids = Producer(client, keys, ManualClock()).enqueue_many(range(10_001))
    assert sizes == [10_000, 1]
    assert len(ids) == len(set(ids)) == 10_001
    assert client.llen(keys.queue) == 10_001


def test_enqueue_many_respects_an_explicit_batch_size(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    sizes: list[int] = []
    original = client.lpush

    def counting(name: str, *values: Any) -> Any:
        sizes.append(len(values))
        return original(name, *values)

    client.lpush = counting  # type: ignore[method-assign]
    Producer(client, keys, ManualClock()).enqueue_many(range(5), batch_size=2)
    assert sizes == [2, 2, 1]
