"""Recovery: prune dead servers, drain in-flight lists back to the queue, requeue stuck tasks.

Every function takes `now` from the caller's injected clock and enumerates in-flight lists from the
registry set, never by SCAN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from . import scripts
from .keys import ListOwner, QueueKeys


@dataclass(frozen=True)
class ServerIdentity:
    """One process's hold on a server id."""

    server_id: str
    incarnation: int


@dataclass
class RecoveryReport:
    pruned: list[str] = field(default_factory=list)
    drained_lists: dict[str, int] = field(default_factory=dict)
    requeued_stuck: int = 0
    stale_records: int = 0

    @property
    def moved(self) -> int:
        return sum(self.drained_lists.values())


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def prune_inactive_servers(client: redis.Redis, keys: QueueKeys, now: float) -> list[str]:
    """Deregister every server whose heartbeat deadline is not in the future."""
    expired = client.eval(scripts.PRUNE_INACTIVE_SERVERS, 2, keys.servers, keys.incarnations,
                          repr(now))
    return [_text(s) for s in expired]


def drain_inflight(
    client: redis.Redis,
    keys: QueueKeys,
    list_key: str,
    now: float,
    *,
    force: bool,
    chunk: int = 100,
) -> int:
    """Move a list's tasks back to the queue; returns how many moved.

    Bounded by the length read up front: if something keeps appending (a stalled worker still
    taking into a list judged dead), the drain still ends, after at most that many moves. Without
    `force`, each chunk re-checks inside its atomic step that the owner is still not live.
    """
    owner = keys.owner_of(list_key)
    budget = int(client.llen(list_key))
    moved = 0
    while moved < budget:
        step = int(
            client.eval(
                scripts.DRAIN_CHUNK, 5, list_key, keys.queue, keys.processing, keys.servers,
                keys.incarnations, min(chunk, budget - moved), owner.server_id,
                owner.incarnation, repr(now), "force" if force else "dead-only",
            )
        )
        if step <= 0:
            break
        moved += step
    return moved


def live_owners(client: redis.Redis, keys: QueueKeys, now: float) -> set[ServerIdentity]:
    """The (server id, incarnation) pairs that hold custody legitimately right now."""
    pipe = client.pipeline(transaction=False)
    pipe.zrangebyscore(keys.servers, f"({now!r}", "+inf")
    pipe.hgetall(keys.incarnations)
    registered, incarnations = pipe.execute()
    return {
        ServerIdentity(_text(s), int(incarnations[s]))
        for s in registered
        if s in incarnations
    }


def registered_lists(client: redis.Redis, keys: QueueKeys) -> list[str]:
    return sorted(_text(k) for k in client.smembers(keys.inflight_registry))


def recover_inflight(
    client: redis.Redis,
    keys: QueueKeys,
    now: float,
    me: ServerIdentity,
    *,
    include_self: bool,
    chunk: int = 100,
) -> dict[str, int]:
    """Drain the in-flight lists that cannot belong to a live worker.

    include_self=True (startup drain): our own server id's lists are drained too: the id is
    exclusive, so whatever they hold is debris of an earlier run. include_self=False (periodic
    sweep): our own lists are never touched -- our running workers hold those tasks -- and neither
    is any list of a live server.
    """
    live = live_owners(client, keys, now)
    drained: dict[str, int] = {}
    for list_key in registered_lists(client, keys):
        owner = keys.owner_of(list_key)
        if owner.server_id == me.server_id:
            if not include_self:
                continue
            moved = drain_inflight(client, keys, list_key, now, force=True, chunk=chunk)
        elif ServerIdentity(owner.server_id, owner.incarnation) in live:
            continue
        else:
            moved = drain_inflight(client, keys, list_key, now, force=False, chunk=chunk)
        if moved:
            drained[list_key] = moved
    return drained


def sweep(
    client: redis.Redis, keys: QueueKeys, now: float, me: ServerIdentity, *, chunk: int = 100
) -> RecoveryReport:
    """One periodic pass: prune first, so that servers found dead on this pass are drained on
    this pass, not a whole period later; then drain; then the processing sweep."""
    report = RecoveryReport()
    report.pruned = prune_inactive_servers(client, keys, now)
    report.drained_lists = recover_inflight(client, keys, now, me, include_self=False,
                                            chunk=chunk)
    report.requeued_stuck, report.stale_records = requeue_stuck_processing_tasks(
        client, keys, now, me
    )
    return report


def parse_record(value: bytes | str) -> tuple[str, float]:
    list_key, _, started = _text(value).partition(" ")
    return list_key, float(started or 0.0)


def requeue_stuck_processing_tasks(
    client: redis.Redis, keys: QueueKeys, now: float, me: ServerIdentity
) -> tuple[int, int]:
    """The older recovery path: tasks whose processing record names a list that is not live.

    Returns (requeued, stale records deleted). Records of our own server id are left to our
    workers. The script removes the task from custody in the same step that requeues it.
    """
    requeued = stale = 0
    for task_id, value in client.hgetall(keys.processing).items():
        list_key, _ = parse_record(value)
        owner: ListOwner = keys.owner_of(list_key)
        if owner.server_id == me.server_id:
            continue
        result = int(
            client.eval(
                scripts.REQUEUE_STUCK, 5, keys.processing, keys.queue, list_key, keys.servers,
                keys.incarnations, _text(task_id), owner.server_id, owner.incarnation, repr(now),
            )
        )
        requeued += result == 1
        stale += result == 2
    return requeued, stale
