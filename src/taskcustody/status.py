"""A read-only snapshot of one queue: depth, custody per server and worker, servers, records."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from .keys import QueueKeys
from .recovery import _text, live_owners, parse_record, registered_lists


@dataclass
class QueueStatus:
    queue: str
    depth: int
    inflight: dict[str, dict[str, int]] = field(default_factory=dict)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    processing: int = 0
    dead_letters: int = 0
    committed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_status(client: redis.Redis, keys: QueueKeys, now: float) -> QueueStatus:
    pipe = client.pipeline(transaction=False)
    pipe.llen(keys.queue)
    pipe.zrange(keys.servers, 0, -1, withscores=True)
    pipe.hgetall(keys.incarnations)
    pipe.hlen(keys.processing)
    pipe.llen(keys.dead_letters)
    pipe.get(keys.committed)
    depth, servers, incarnations, processing, dead, committed = pipe.execute()
    live = live_owners(client, keys)
    status = QueueStatus(keys.queue_name, int(depth), processing=int(processing),
                         dead_letters=int(dead), committed=int(committed or 0))
    for server, deadline in servers:
        name = _text(server)
        status.servers[name] = {
            "deadline": float(deadline),
            "incarnation": int(incarnations.get(server, -1)),
            "registered": float(deadline) > now,
        }
    for list_key in registered_lists(client, keys):
        owner = keys.owner_of(list_key)
        length = int(client.llen(list_key))
        label = f"{owner.server_id}#{owner.incarnation}"
        if length or any(i.server_id == owner.server_id and i.incarnation == owner.incarnation
                         for i in live):
            status.inflight.setdefault(label, {})[owner.worker_id] = length
    return status


def processing_records(client: redis.Redis, keys: QueueKeys) -> dict[str, tuple[str, float]]:
    return {_text(k): parse_record(v) for k, v in client.hgetall(keys.processing).items()}
