"""`Settings.min_replicas`: a WAIT after each write that matters, and what a short one means.

Redis replicates asynchronously: a write is acknowledged by the primary before any replica has
it. With `min_replicas` = N > 0, every enqueue, take and release is followed by `WAIT N timeout`
in the same write to the socket (a pipeline), so it costs no round trip of its own; WAIT returns
how many replicas hold every earlier write of that connection.

A short WAIT never undoes the write (Redis has no way to): the primary has it. What differs is
who hears about it:

- a producer raises `ReplicationTimeout` (an enqueue is acknowledged only once N replicas hold
  it; the exception says the task is nevertheless in the primary's queue);
- a worker carries on: the task it took is in its custody on the primary, the release it sent
  is committed there. Failing the task would not take either back. It counts the shortfall and
  logs a warning at most once per `WARN_INTERVAL` seconds of its clock.

See docs/guides/failover.md for what a failover may then undo.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Literal

import redis

from ..core.clock import Clock
from ..core.errors import TaskCustodyError
from ..core.settings import Settings
from .connection import is_fakeredis

log = logging.getLogger("taskcustody.replication")

#: Seconds between two warnings of one worker about WAITs that returned short.
WARN_INTERVAL = 60.0
#: The steps a worker's WAIT follows, as its warnings name them.
Step = Literal["take", "release"]
TAKE: Final[Step] = "take"
RELEASE: Final[Step] = "release"


def wait_command(settings: Settings) -> tuple[Any, ...] | None:
    """The WAIT to append to a write, or None without `min_replicas`."""
    if settings.min_replicas == 0:
        return None
    return ("WAIT", settings.min_replicas, settings.replica_timeout_ms)


def refuse_fakeredis(client: redis.Redis, settings: Settings) -> None:
    """fakeredis has no replicas and answers WAIT with "unknown command" (pinned in
    tests/test_fakeredis_gaps.py): say so up front rather than fail on every write."""
    if settings.min_replicas and is_fakeredis(client):
        raise TaskCustodyError(
            "min_replicas needs a real Redis primary with replicas: fakeredis implements no "
            "WAIT; use min_replicas=0 on fakeredis"
        )


def acknowledged(reply: Any) -> tuple[int, str]:
    """WAIT's reply as (replicas that acknowledged, why not a number). An error reply (e.g. WAIT
    sent to a replica) counts as no replica: it confirms nothing."""
    if isinstance(reply, Exception):
        return 0, str(reply)
    return int(reply), ""


class Shortfalls:
    """A worker's WAITs that returned fewer than `min_replicas`: counted, and logged at most once
    per `WARN_INTERVAL` (a lagging replica would otherwise log twice per task)."""

    def __init__(self, settings: Settings, clock: Clock, name: str) -> None:
        self.settings = settings
        self.clock = clock
        self.name = name
        self.count = 0
        self._unlogged = 0
        self._next_warning: float | None = None

    def check(self, reply: Any, step: Step) -> None:
        """Check WAIT's reply after `step` ("take" or "release")."""
        acks, reason = acknowledged(reply)
        if acks >= self.settings.min_replicas:
            return
        self.count += 1
        self._unlogged += 1
        now = self.clock.now()
        if self._next_warning is not None and now < self._next_warning:
            return
        self._next_warning = now + WARN_INTERVAL
        why = f" ({reason})" if reason else ""
        log.warning(
            "worker %s: %d WAIT(s) returned short since the last warning; the last, after a %s, "
            "got %d of %d replica(s) within %g s%s. The %s stands on the primary (a failover "
            "to a replica that missed it may run a task twice); carrying on",
            self.name,
            self._unlogged,
            step,
            acks,
            self.settings.min_replicas,
            self.settings.replica_timeout,
            why,
            step,
        )
        self._unlogged = 0
