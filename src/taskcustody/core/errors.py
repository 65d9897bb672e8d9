"""The errors taskcustody raises on purpose, each naming what is wrong."""

from __future__ import annotations

import redis


class TaskCustodyError(Exception):
    """Base of every error this library raises on purpose."""


class RedisTooOld(TaskCustodyError):
    """The server lacks BLMOVE/LMOVE (Redis < 6.2)."""


class ServerIdHeld(TaskCustodyError):
    """Another live process holds this server id (its heartbeat deadline lies in the future)."""


class StoppedBeforeStart(TaskCustodyError):
    """Stopped (SIGTERM/SIGINT, or `stop`) while waiting for the server id to be free: nothing was
    claimed, taken or registered, so there is nothing to release."""


class Superseded(TaskCustodyError):
    """A newer incarnation claimed our server id while we were stalled: we must stop taking."""


class WrongKeyType(TaskCustodyError, redis.ResponseError):
    """A key of the queue holds a value of the wrong Redis type. A redis-py ResponseError too: the
    library used to let the raw WRONGTYPE through in some places, and callers may catch that."""


class ReleaseRefused(TaskCustodyError, redis.ResponseError):
    """Redis answered a release (or a release-and-take) with an error reply that is neither out of
    memory nor a cluster redirect: an argument it refuses, which the release script checks before
    its first write (lua/lib/release_arguments_checked.lua), or a command the Redis user may not
    run. The task is still in the worker's in-flight list, not committed. The worker is dirty, so
    it drains that list back to the queue before its next take (the reconcile, as after a crash);
    the production loop backs off and logs the refusal at most once per
    `Settings.oom_log_interval` (or when its text changes), instead of crashing. A redis-py
    ResponseError too, as it was raised before."""


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

    def __init__(
        self,
        acknowledged: int,
        wanted: int,
        timeout: float,
        unconfirmed: list[str],
        confirmed: list[str] | None = None,
        unsent: list[str] | None = None,
        reason: str = "",
    ) -> None:
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


# -- errors a user causes through the server or the keyspace (redis_errors.translate names them) --


class BadPayload(TaskCustodyError, ValueError):
    """A payload JSON cannot hold (NaN, infinities, sets, objects): nothing was enqueued. A
    ValueError too, as the plain ValueError raised before it was."""


class NotRedis(TaskCustodyError):
    """What answered at the URL does not speak the Redis protocol (an HTTP server, say)."""


class NoSuchDatabase(TaskCustodyError, redis.ResponseError):
    """The URL names a database index the server does not have (`databases` in redis.conf)."""


class AuthenticationFailed(TaskCustodyError, redis.AuthenticationError):
    """Redis refused the credentials (NOAUTH, WRONGPASS, or a password it does not expect). A
    redis-py AuthenticationError (so a ConnectionError) too, as before."""


class NoPermission(TaskCustodyError, redis.ResponseError):
    """The Redis user may not run a command taskcustody needs (ACL: NOPERM)."""


class ReadOnlyReplica(TaskCustodyError, redis.ResponseError):
    """The URL points at a read-only replica: taskcustody writes, so it needs the primary."""


class ClusterRedirect(TaskCustodyError, redis.ResponseError):
    """A Redis Cluster node answered MOVED/ASK/CLUSTERDOWN/CROSSSLOT to a plain client: the queue
    lives in a cluster and must be reached in cluster mode (or the cluster is down)."""


class TaskFailed(TaskCustodyError):
    """The task was dead-lettered (its handler failed `max_attempts` times, or its envelope was
    malformed): it will not produce a result unless requeued."""

    def __init__(self, task_id: str, error: str, attempts: int) -> None:
        first = error.strip().splitlines()[-1] if error.strip() else "no error text"
        super().__init__(
            f"task {task_id} failed after {attempts} attempt(s) and was dead-lettered: {first}"
        )
        self.task_id = task_id
        self.error = error
        self.attempts = attempts


class ResultTimeout(TaskCustodyError, TimeoutError):
    """No result within the timeout: the task is still queued or running, its result expired
    (`Settings.result_ttl`), or no task of that id ever committed."""


class UnknownTask(TaskCustodyError, LookupError):
    """`get_result` found no task of that id anywhere in the queue: not queued, scheduled, among
    the suspects, in flight or dead-lettered, and no result stored -- in one atomic look. It was
    never enqueued on this queue (or under this prefix), or it committed and its result expired
    or was not kept (`Settings.result_ttl`), or its dead letter was purged."""

    def __init__(self, task_id: str, queue_name: str) -> None:
        super().__init__(
            f"no task {task_id} in queue {queue_name!r}: it is not queued, scheduled, in flight "
            "or dead-lettered, and no result is stored (never enqueued on this queue, or its "
            "result expired or was not kept: result_ttl)"
        )
        self.task_id = task_id
        self.queue_name = queue_name


class DeadLetterNotFound(TaskCustodyError, LookupError):
    """No dead letter holds that task id."""
