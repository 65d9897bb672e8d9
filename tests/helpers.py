"""Helpers shared by the custody tests: servers on an injected clock, reading state back."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from taskcustody import ManualClock, QueueKeys, Server, Settings
from taskcustody.core.envelope import decode
from tests.conftest import TEST_SETTINGS


def make_server(
    client: redis.Redis,
    keys: QueueKeys,
    server_id: str,
    clock: ManualClock,
    handler: Callable[[Any], Any] = lambda p: None,
    workers: int = 1,
    settings: Settings = TEST_SETTINGS,
) -> Server:
    return Server(client, keys, server_id, handler, workers=workers, settings=settings, clock=clock)


def ids_in(client: redis.Redis, key: str) -> list[str]:
    return [decode(raw).id for raw in client.lrange(key, 0, -1)]


def all_custody(client: redis.Redis, keys: QueueKeys) -> Counter[str]:
    """Every task id in the queue, the suspects list and every registered in-flight list, with
    multiplicity."""
    seen: Counter[str] = Counter(ids_in(client, keys.queue) + ids_in(client, keys.suspects))
    for list_key in client.zrange(keys.inflight_registry, 0, -1):
        seen.update(ids_in(client, list_key.decode()))
    return seen


def commits(client: redis.Redis, keys: QueueKeys) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(keys.commit_log).items()}


def dead_letters(client: redis.Redis, keys: QueueKeys) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.lrange(keys.dead_letters, 0, -1)]


def parse_record_owner(client: redis.Redis, keys: QueueKeys, task_id: str) -> str | None:
    value = client.hget(keys.processing, task_id)
    return None if value is None else value.decode().partition(" ")[0]


class Stop:
    """A stop event that records each pause asked for and calls `hook(n)` at the n-th (1-based)
    instead of sleeping."""

    def __init__(self, hook: Callable[[int], None] = lambda n: None) -> None:
        self.flag = False
        self.waits: list[float | None] = []
        self.hook = hook

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.hook(len(self.waits))
        return self.flag
