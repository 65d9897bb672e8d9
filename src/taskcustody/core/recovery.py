"""Recovery: prune dead servers, drain in-flight lists back to the queue, requeue stuck tasks,
and forget dead, empty lists so that the registry stays bounded.

In-flight lists are enumerated from the registry, never by SCAN. Time enters only from the
caller's injected clock (the prune, and the age of a registration); liveness is registration.
Reads and checks go in batches (`BATCH` lists per round trip), so a pass over a large registry
costs a round trip per hundred lists, not one per list.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from ..ops import events
from . import scripts
from .keys import ListOwner, QueueKeys

#: Lists per round trip when a pass reads lengths or collects garbage.
BATCH = 100

log = logging.getLogger("taskcustody.recovery")


@dataclass(frozen=True)
class Recovering:
    """How a recovery step counts what it takes back (poison-pill detection): a task recovered
    more than `max_recoveries` times is dead-lettered in that step (None: not counted). `now`
    stamps the dead letter."""

    max_recoveries: int | None = None
    now: float = 0.0

    def argv(self) -> tuple[str, str]:
        return ("" if self.max_recoveries is None else str(self.max_recoveries), repr(self.now))


#: Recovery that counts nothing (the default of the lower-level steps).
NOT_COUNTING = Recovering()


def _log_poison_pills(reply: list[object], list_key: str) -> None:
    for i in range(1, len(reply), 3):
        task_id, recoveries, holders = (
            _text(x) if isinstance(x, (bytes, str)) else x for x in reply[i : i + 3]
        )
        log.error(
            "poison pill: task %s dead-lettered from %s: recovered %s times from holders "
            "that died (%s)",
            task_id,
            list_key,
            recoveries,
            holders,
            extra={"task_id": task_id, "action": "poison-pill"},
        )


def _task_id(raw: object) -> str:
    try:
        task_id = json.loads(raw)["id"]  # type: ignore[arg-type]
    except (ValueError, TypeError, KeyError):
        return "?"
    return str(task_id)


def _log_requeued(
    reply: list[object], peek: list[bytes | str], step: int, list_key: str, how: str, where: str
) -> None:
    """One line per task a drain chunk moved (the last `step` of `peek`, taken from the right)
    to `where` (the queue, or the suspects list when recovery counts), poison pills left out
    (they have a line of their own)."""
    dead = {_text(x) for x in reply[1::3] if isinstance(x, (bytes, str))}
    for raw in reversed(peek[len(peek) - step :] if step <= len(peek) else peek):
        task_id = _task_id(raw)
        if task_id not in dead:
            log.info(
                "recovery (%s): task %s moved from %s to %s",
                how,
                task_id,
                list_key,
                where,
                extra={"task_id": task_id, "action": "recovered"},
            )


@dataclass(frozen=True)
class ServerIdentity:
    """One process's hold on a server id."""

    server_id: str
    incarnation: int


@dataclass
class RecoveryReport:
    pruned: list[str] = field(default_factory=list)
    forgotten_lists: list[str] = field(default_factory=list)
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
    expired = client.eval(
        scripts.PRUNE_INACTIVE_SERVERS, 2, keys.servers, keys.incarnations, repr(now)
    )
    return [_text(s) for s in expired]


#: Verification only (`taskcustody.verify.stepping`); None in production, where it costs one
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
    length: int | None = None,
    recovering: Recovering = NOT_COUNTING,
) -> int:
    """Move a list's tasks back to the queue; returns how many moved.

    Bounded by the length read up front (`length`, if the caller read it in a batch): if something
    keeps appending (a stalled worker still taking into a list judged dead), the drain still ends,
    after at most that many moves. Without `force`, each chunk re-checks inside its atomic step
    that the owner is still not live. Each move counts the task's recovery (`recovering`); a
    counted task goes to the suspects list (it runs alone from then on), a poison pill to the
    dead letters instead, and is logged.
    """
    owner = keys.owner_of(list_key)
    budget = int(client.llen(list_key)) if length is None else length
    moved = 0
    logging_tasks = log.isEnabledFor(logging.INFO)
    while moved < budget:
        limit = min(chunk, budget - moved)
        # For the log only (when INFO is on): the ids at the list's drain end, read just before
        # the chunk moves them (exact unless a stalled owner releases one in between).
        peek = client.lrange(list_key, -limit, -1) if logging_tasks else []
        reply = client.eval(
            scripts.DRAIN_CHUNK,
            8,
            list_key,
            keys.queue,
            keys.processing,
            keys.servers,
            keys.incarnations,
            keys.recoveries,
            keys.dead_letters,
            keys.suspects,
            limit,
            owner.server_id,
            owner.incarnation,
            "force" if force else "dead-only",
            *recovering.argv(),
        )
        step = int(reply[0])
        if step <= 0:
            break
        _log_poison_pills(reply, list_key)
        if events.listeners:
            pills = (len(reply) - 1) // 3
            events.emit("recovered", list_key=list_key, count=step - pills)
            events.emit("poison-pill", list_key=list_key, count=pills)
        if logging_tasks:
            _log_requeued(
                reply,
                peek,
                step,
                list_key,
                "startup drain" if force else "sweep",
                "the queue" if recovering.max_recoveries is None else keys.suspects,
            )
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
    return {ServerIdentity(_text(s), int(incarnations[s])) for s in registered if s in incarnations}


def registrations(client: redis.Redis, keys: QueueKeys) -> dict[str, float]:
    """The registry: every registered in-flight list with the time of its last registration."""
    entries: list[tuple[bytes | str, float]] = client.zrange(  # type: ignore[assignment]
        keys.inflight_registry, 0, -1, withscores=True
    )
    return {_text(k): float(t) for k, t in entries}


def registered_lists(client: redis.Redis, keys: QueueKeys) -> list[str]:
    return sorted(registrations(client, keys))


def migrate_legacy_registry(client: redis.Redis, keys: QueueKeys, now: float) -> int:
    """Move the lists of version 0.1's registry (a set) into the registry, in one atomic step;
    returns how many. A no-op once done."""
    return int(
        client.eval(
            scripts.MIGRATE_LEGACY_REGISTRY,
            2,
            keys.inflight_registry,
            keys.legacy_inflight_registry,
            repr(now),
        )
    )


def lengths(client: redis.Redis, lists: list[str]) -> dict[str, int]:
    """LLEN of every list, `BATCH` per round trip."""
    out: dict[str, int] = {}
    for start in range(0, len(lists), BATCH):
        batch = lists[start : start + BATCH]
        pipe = client.pipeline(transaction=False)
        for k in batch:
            pipe.llen(k)
        out.update(zip(batch, (int(n) for n in pipe.execute()), strict=True))
    return out


def forget_dead_empty_lists(
    client: redis.Redis,
    keys: QueueKeys,
    registered: dict[str, float],
    live: set[ServerIdentity],
    me: ServerIdentity,
    cutoff: float,
) -> list[str]:
    """The registry's garbage collection: forget every list that is empty, whose owner is not
    live, and whose last registration is at or before `cutoff` (now - the grace; see
    `scripts.FORGET_DEAD_EMPTY_LISTS` for why the age makes it safe). Candidates are picked from
    what the caller read; each is re-checked inside the atomic step that forgets it, `BATCH` per
    round trip. Never our own lists."""
    candidates = [
        k
        for k, at in sorted(registered.items())
        if at <= cutoff and _identity(keys.owner_of(k)) not in live | {me}
    ]
    forgotten: list[str] = []
    for start in range(0, len(candidates), BATCH):
        batch = candidates[start : start + BATCH]
        owners = [keys.owner_of(k) for k in batch]
        argv: list[str | int | float] = [repr(cutoff)]
        for owner in owners:
            argv += [owner.server_id, owner.incarnation]
        gone = client.eval(
            scripts.FORGET_DEAD_EMPTY_LISTS,
            3 + len(batch),
            keys.inflight_registry,
            keys.servers,
            keys.incarnations,
            *batch,
            *argv,
        )
        forgotten.extend(_text(k) for k in gone)
    return forgotten


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
    registered: dict[str, float] | None = None,
    live: set[ServerIdentity] | None = None,
    recovering: Recovering = NOT_COUNTING,
) -> dict[str, int]:
    """Drain the lists `lists_to_recover` selects; returns the moves per list. Their lengths are
    read in batches up front (an empty list costs no drain), and bound each drain.

    Startup drains are forced (our id's lists cannot belong to anyone live); the sweep's drains
    re-check inside each atomic step that the owner is still not live."""
    if live is None:
        live = live_owners(client, keys)
    if registered is None:
        registered = registrations(client, keys)
    drained: dict[str, int] = {}
    selected = lists_to_recover(keys, sorted(registered), live, me, include_self=include_self)
    for list_key, length in lengths(client, selected).items():
        if length == 0:
            continue
        moved = drain_inflight(
            client,
            keys,
            list_key,
            force=include_self,
            chunk=chunk,
            length=length,
            recovering=recovering,
        )
        if moved:
            drained[list_key] = moved
    return drained


def sweep(
    client: redis.Redis,
    keys: QueueKeys,
    now: float,
    me: ServerIdentity,
    *,
    chunk: int = 100,
    grace: float = 60.0,
    max_recoveries: int | None = None,
) -> RecoveryReport:
    """One periodic pass: prune first, so that servers found dead on this pass are drained on
    this pass, not a whole period later; forget dead lists that are empty and older than the
    `grace`; then drain; then the processing sweep."""
    report = RecoveryReport()
    report.pruned = prune_inactive_servers(client, keys, now)
    live = live_owners(client, keys)
    registered = registrations(client, keys)
    report.forgotten_lists = forget_dead_empty_lists(
        client, keys, registered, live, me, now - grace
    )
    for k in report.forgotten_lists:
        del registered[k]
    recovering = Recovering(max_recoveries, now)
    report.drained_lists = recover_inflight(
        client,
        keys,
        me,
        include_self=False,
        chunk=chunk,
        registered=registered,
        live=live,
        recovering=recovering,
    )
    report.requeued_stuck, report.stale_records = requeue_stuck_processing_tasks(
        client, keys, me, recovering
    )
    return report


def parse_record(value: bytes | str) -> tuple[str, float]:
    list_key, _, started = _text(value).partition(" ")
    return list_key, float(started or 0.0)


def requeue_stuck_processing_tasks(
    client: redis.Redis,
    keys: QueueKeys,
    me: ServerIdentity,
    recovering: Recovering = NOT_COUNTING,
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
                scripts.REQUEUE_STUCK,
                8,
                keys.processing,
                keys.queue,
                list_key,
                keys.servers,
                keys.incarnations,
                keys.recoveries,
                keys.dead_letters,
                keys.suspects,
                _text(task_id),
                owner.server_id,
                owner.incarnation,
                *recovering.argv(),
            )
        )
        requeued += result == 1
        if events.listeners and result in (1, 3):
            events.emit("recovered" if result == 1 else "poison-pill", list_key=list_key, count=1)
        if result == 1:
            log.info(
                "recovery (sweep): task %s moved from %s to %s (stuck processing record)",
                _text(task_id),
                list_key,
                "the queue" if recovering.max_recoveries is None else keys.suspects,
                extra={"task_id": _text(task_id), "action": "recovered"},
            )
        stale += result == 2
        if result == 3:
            log.error(
                "poison pill: task %s dead-lettered from %s: recovered once too often "
                "from holders that died",
                _text(task_id),
                list_key,
                extra={"task_id": _text(task_id), "action": "poison-pill"},
            )
    return requeued, stale
