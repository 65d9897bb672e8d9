"""The errors taskcustody raises on purpose, each naming what is wrong."""

from __future__ import annotations


class TaskCustodyError(Exception):
    """Base of every error this library raises on purpose."""


class RedisTooOld(TaskCustodyError):
    """The server lacks BLMOVE/LMOVE (Redis < 6.2)."""


class ServerIdHeld(TaskCustodyError):
    """Another live process holds this server id (its heartbeat deadline lies in the future)."""


class Superseded(TaskCustodyError):
    """A newer incarnation claimed our server id while we were stalled: we must stop taking."""


class WrongKeyType(TaskCustodyError):
    """A key of the queue holds a value of the wrong Redis type."""


class MalformedTask(TaskCustodyError):
    """Bytes in the queue that are not a task envelope (not JSON, or no id)."""

    def __init__(self, raw: bytes, reason: str) -> None:
        super().__init__(f"malformed task envelope ({reason}): {raw[:80]!r}")
        self.raw = raw
        self.reason = reason


class InvalidName(TaskCustodyError, ValueError):
    """A queue name, prefix, server id or worker id that would break the key schema."""


class EvictingPolicy(TaskCustodyError):
    """The server's maxmemory-policy (allkeys-*) may evict a queue or an in-flight list."""

    def __init__(self, policy: str) -> None:
        super().__init__(
            f"Redis maxmemory-policy is {policy}: under memory pressure Redis may evict any key, "
            "including this queue and its in-flight lists, and their tasks would be lost. Fix: "
            "CONFIG SET maxmemory-policy noeviction (or a volatile-* policy: taskcustody's custody "
            "keys carry no TTL), or run anyway with --allow-evicting-policy "
            "(Settings(allow_evicting_policy=True))"
        )
        self.policy = policy


class RedisOutOfMemory(TaskCustodyError):
    """Redis refused a write (OOM: used memory > maxmemory under noeviction). The refused command
    did not run; `enqueued` names the tasks of an `enqueue_many` that were enqueued before it."""

    def __init__(self, message: str, enqueued: list[str] | None = None) -> None:
        super().__init__(message)
        self.enqueued = list(enqueued or [])


class ReplicationTimeout(TaskCustodyError):
    """A write ran on the primary, but fewer replicas than `Settings.min_replicas` acknowledged it
    within `Settings.replica_timeout` (Redis WAIT). The write is NOT undone: the tasks named here
    are in the primary's queue and may run, or may be lost if the primary fails over to a replica
    that missed them. Enqueueing them again may run them twice."""

    def __init__(self, acknowledged: int, wanted: int, timeout: float,
                 unconfirmed: list[str], confirmed: list[str] | None = None,
                 unsent: list[str] | None = None, reason: str = "") -> None:
        self.acknowledged = acknowledged
        self.wanted = wanted
        self.timeout = timeout
        self.unconfirmed = unconfirmed  # on the primary; replication not confirmed
        self.confirmed = confirmed or []  # on the primary and on >= wanted replicas
        self.unsent = unsent or []  # never sent (enqueue_many stops at the first shortfall)
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"{acknowledged} of {wanted} replica(s) acknowledged within {timeout:g} s{why}; "
            f"{len(unconfirmed)} task(s) ARE in the primary's queue but not confirmed on "
            f"{wanted} replica(s): they may run, or be lost if the primary fails over; "
            f"enqueueing them again may run them twice"
        )
