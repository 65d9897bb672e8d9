"""Recovery: prune dead servers, drain in-flight lists back to the queue, requeue stuck tasks.

In-flight lists are enumerated from the registry set, never by SCAN. Time enters only through
`prune_inactive_servers`, from the caller's injected clock; liveness is registration.
"""

from __future__ import annotations

from collections.abc import Callable
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


#: Verification only (`taskcustody.verify.harness`); None in production, where it costs one
#: global lookup per chunk. Called with the list's key after every chunk a drain moves, so that
#: the stateful machine can let a stalled worker append to the list *while* it is drained: the
#: interleaving that tells a drain bounded by the LLEN read up front from one that loops until
#: the list is empty (design 6 of docs/protocol.md). Nothing else may set it.
between_drain_chunks: Callable[[str], None] | None = None


def drain_inflight(
    client: redis.Redis,
    keys: QueueKeys,
    list_key: str,
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
                owner.incarnation, "force" if force else "dead-only",
            )
        )
        if step <= 0:
            break
        moved += step
        if between_drain_chunks is not None:
            between_drain_chunks(list_key)
    return moved


def live_owners(client: redis.Redis, keys: QueueKeys) -> set[ServerIdentity]:
    """The (server id, incarnation) pairs registered right now. Registration, not the clock: an
    expired server stays live until `prune_inactive_servers` removes it."""
    pipe = client.pipeline(transaction=False)
    pipe.zrange(keys.servers, 0, -1)
    pipe.hgetall(keys.incarnations)
    registered, incarnations = pipe.execute()
    return {
        ServerIdentity(_text(s), int(incarnations[s]))
        for s in registered
        if s in incarnations
    }


def registered_lists(client: redis.Redis, keys: QueueKeys) -> list[str]:
    return sorted(_text(k) for k in client.smembers(keys.inflight_registry))


def _identity(owner: ListOwner) -> ServerIdentity:
    return ServerIdentity(owner.server_id, owner.incarnation)


def lists_to_recover(
    keys: QueueKeys,
    lists: list[str],
    live: set[ServerIdentity],
    me: ServerIdentity,
    *,
    include_self: bool,
) -> list[str]:
    """Which in-flight lists a pass drains.

    include_self=True (startup drain): every list of our own server id. We have just claimed the
    id, and it is exclusive, so whatever those lists hold is debris of an earlier run of it.
    include_self=False (periodic sweep): every list whose owner is not live -- never our own
    incarnation's lists (our running workers hold those tasks), never a live server's.
    """
    if include_self:
        return [k for k in lists if keys.owner_of(k).server_id == me.server_id]
    chosen = []
    for k in lists:
        owner = _identity(keys.owner_of(k))
        if owner != me and owner not in live:
            chosen.append(k)
    return chosen


def recover_inflight(
    client: redis.Redis,
    keys: QueueKeys,
    me: ServerIdentity,
    *,
    include_self: bool,
    chunk: int = 100,
) -> dict[str, int]:
    """Drain the lists `lists_to_recover` selects; returns the moves per list.

    Startup drains are forced (our id's lists cannot belong to anyone live); the sweep's drains
    re-check inside each atomic step that the owner is still not live."""
    live = live_owners(client, keys)
    drained: dict[str, int] = {}
    selected = lists_to_recover(keys, registered_lists(client, keys), live, me,
                                include_self=include_self)
    for list_key in selected:
        moved = drain_inflight(client, keys, list_key, force=include_self, chunk=chunk)
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
    report.drained_lists = recover_inflight(client, keys, me, include_self=False, chunk=chunk)
    report.requeued_stuck, report.stale_records = requeue_stuck_processing_tasks(client, keys, me)
    return report


def parse_record(value: bytes | str) -> tuple[str, float]:
    list_key, _, started = _text(value).partition(" ")
    return list_key, float(started or 0.0)


def requeue_stuck_processing_tasks(
    client: redis.Redis, keys: QueueKeys, me: ServerIdentity
) -> tuple[int, int]:
    """The older recovery path: tasks whose processing record names a list that is not live.

    Returns (requeued, stale records deleted). Records of our own incarnation are left to our
    workers. The script removes the task from custody in the same step that requeues it.
    """
    requeued = stale = 0
    for task_id, value in client.hgetall(keys.processing).items():
        list_key, _ = parse_record(value)
        owner: ListOwner = keys.owner_of(list_key)
        if _identity(owner) == me:
            continue
        result = int(
            client.eval(
                scripts.REQUEUE_STUCK, 5, keys.processing, keys.queue, list_key, keys.servers,
                keys.incarnations, _text(task_id), owner.server_id, owner.incarnation,
            )
        )
        requeued += result == 1
        stale += result == 2
    return requeued, stale
