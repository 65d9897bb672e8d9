"""A read-only snapshot of one queue: depth, custody per server and worker, servers, records."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from ..core.keys import QueueKeys
from ..core.recovery import ServerIdentity, _text, parse_record, registered_lists
from ..deploy.redis_errors import named_errors


@dataclass
class QueueStatus:
    queue: str
    depth: int
    inflight: dict[str, dict[str, int]] = field(default_factory=dict)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    processing: int = 0
    dead_letters: int = 0
    committed: int = 0
    #: tasks recovered from a dead holder, waiting to run alone (poison-pill suspects)
    suspects: int = 0
    #: failed tasks waiting for their retry delay in the scheduled set
    scheduled: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_status(client: redis.Redis, keys: QueueKeys, now: float) -> QueueStatus:
    """The snapshot. A key of the wrong type, a wrong URL...: our named errors, not redis-py's."""
    with named_errors(client, keys, *keys.all_fixed_keys()):
        return _snapshot(client, keys, now)


def _snapshot(client: redis.Redis, keys: QueueKeys, now: float) -> QueueStatus:
    pipe = client.pipeline(transaction=False)
    pipe.llen(keys.queue)
    pipe.zrange(keys.servers, 0, -1, withscores=True)
    pipe.hgetall(keys.incarnations)
    pipe.hlen(keys.processing)
    pipe.llen(keys.dead_letters)
    pipe.get(keys.committed)
    pipe.llen(keys.suspects)
    pipe.zcard(keys.scheduled)
    (depth, servers, incarnations, processing, dead, committed, suspects, scheduled) = (
        pipe.execute()
    )
    # Live = registered with that incarnation (what live_owners reads; derived from the same
    # replies here rather than read twice).
    live = {
        ServerIdentity(_text(server), int(incarnations[server]))
        for server, _ in servers
        if server in incarnations
    }
    status = QueueStatus(
        keys.queue_name,
        int(depth),
        processing=int(processing),
        dead_letters=int(dead),
        committed=int(committed or 0),
        suspects=int(suspects),
        scheduled=int(scheduled),
    )
    for server, deadline in servers:
        name = _text(server)
        status.servers[name] = {
            "deadline": float(deadline),
            "incarnation": int(incarnations.get(server, -1)),
            "registered": float(deadline) > now,
        }
    lists = registered_lists(client, keys)
    pipe = client.pipeline(transaction=False)
    for list_key in lists:
        pipe.llen(list_key)
    for list_key, length in zip(lists, pipe.execute(), strict=True):
        owner = keys.owner_of(list_key)
        if length or ServerIdentity(owner.server_id, owner.incarnation) in live:
            label = f"{owner.server_id}#{owner.incarnation}"
            status.inflight.setdefault(label, {})[owner.worker_id] = int(length)
    return status


def processing_records(client: redis.Redis, keys: QueueKeys) -> dict[str, tuple[str, float]]:
    return {_text(k): parse_record(v) for k, v in client.hgetall(keys.processing).items()}
