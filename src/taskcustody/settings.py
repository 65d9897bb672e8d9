"""Tunables of a queue deployment, with the constraints between them checked up front."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    # How long one take blocks server-side before returning empty-handed.
    block_timeout: float = 2.0
    # The socket timeout must exceed the block, or a healthy idle BLMOVE would look like a dead
    # connection; and it must exist, or a dead connection would hang a worker forever.
    socket_timeout_margin: float = 3.0
    heartbeat_interval: float = 5.0
    # A server is registered while now < its deadline = last heartbeat + server_ttl.
    server_ttl: float = 15.0
    sweep_interval: float = 10.0
    # One sweeper at a time (sweep_lease.py): only the lease's holder sweeps, so the sweep load on
    # Redis grows linearly with the fleet instead of with servers x lists. Off: every server
    # sweeps every interval (the old behaviour, kept for measuring it: bench/sweep_load.py).
    sweep_lease: bool = True
    # How long the lease outlives its holder's last renewal (the holder renews at every sweep).
    # None: 3 sweep periods. A dead holder delays recovery by at most this much.
    sweep_lease_ttl: float | None = None
    max_attempts: int = 3
    # Retry delays (docs/protocol.md, section 10): a failed attempt n (from 1) is retried after
    # a delay drawn uniformly in [0, min(retry_backoff_max, retry_backoff * 2**(n-1))] seconds
    # (full jitter), waiting in the scheduled set until the server's background loop (or
    # `taskcustody sweep`) promotes it to the queue. 0: retry at once (no scheduled set).
    retry_backoff: float = 1.0
    retry_backoff_max: float = 300.0
    # Poison pills: a task that recovery took back from holders that died more than this many
    # times is dead-lettered by the step that would have requeued it (None: never). Deaths are
    # counted apart from max_attempts, which counts releases.
    max_recoveries: int | None = 3
    drain_chunk: int = 100
    # Seconds a task's result (its handler's return value, JSON) is kept after it commits, for
    # results.get_result / `taskcustody result`; every committed task leaves one key for that long.
    # 0: store no results at all.
    result_ttl: int = 86_400
    shutdown_grace: float = 30.0
    # Tasks a worker thread takes in one round trip while the queue is busy (each into an
    # in-flight list of its own, see prefetch.py); 1 = one task per take, the plain cycle of
    # docs/protocol.md.
    prefetch: int = 1
    # Keep a per-task commit count (for verification; costs one hash field per task).
    track_commits: bool = False
    # How old a dead, empty in-flight list's last registration must be before a sweep forgets
    # it. A take registers its list in the same write as its BLMOVE, and Redis serves or times
    # out that BLMOVE within block_timeout: the grace must exceed it (with room for clock error
    # between hosts), so that no take can still be pending into a list the sweep forgets.
    # 0 turns the age check off: only for `verify`, whose takes never wait on an empty queue.
    registry_grace: float = 60.0
    # Run against a server whose maxmemory-policy is allkeys-* (which may evict a queue or an
    # in-flight list under memory pressure): refused unless set, and then warned once per process.
    allow_evicting_policy: bool = False
    # While Redis refuses writes for lack of memory (OOM), a worker or the heartbeat loop says so
    # at most once per this many seconds of the injected clock.
    oom_log_interval: float = 30.0
    # Replicas that must acknowledge each enqueue, take and release (Redis WAIT, sent in the same
    # write as the command: no extra round trip). 0 = Redis's asynchronous replication as is.
    # See the README, "Failover and replication", for what it does and does not guarantee.
    min_replicas: int = 0
    # Seconds a WAIT may block before it returns short (a producer then raises
    # ReplicationTimeout; a worker logs and carries on). Seconds like every other duration here;
    # sent to Redis in milliseconds.
    replica_timeout: float = 1.0

    def __post_init__(self) -> None:
        if self.block_timeout <= 0:
            raise ValueError("block_timeout must be > 0 (0 would block forever)")
        if self.socket_timeout_margin <= 0:
            raise ValueError("socket_timeout_margin must be > 0")
        if self.server_ttl <= self.heartbeat_interval:
            raise ValueError("server_ttl must exceed heartbeat_interval")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.retry_backoff < 0 or not math.isfinite(self.retry_backoff):
            raise ValueError("retry_backoff must be a finite number >= 0 (0: retry at once)")
        if self.retry_backoff_max < self.retry_backoff or not math.isfinite(
                self.retry_backoff_max):
            raise ValueError("retry_backoff_max must be finite and >= retry_backoff")
        if self.max_recoveries is not None and self.max_recoveries < 0:
            raise ValueError("max_recoveries must be >= 0 (or None: never dead-letter)")
        if self.prefetch < 1:
            raise ValueError("prefetch must be >= 1")
        if self.oom_log_interval <= 0:
            raise ValueError("oom_log_interval must be > 0")
        if self.result_ttl < 0:
            raise ValueError("result_ttl must be >= 0 (0 stores no results)")
        if self.drain_chunk < 1:
            raise ValueError("drain_chunk must be >= 1")
        if self.registry_grace != 0 and (
            self.registry_grace <= self.block_timeout + self.socket_timeout_margin
        ):
            raise ValueError(
                "registry_grace must exceed block_timeout + socket_timeout_margin: a take may "
                "be pending that long"
            )
        if self.min_replicas < 0:
            raise ValueError("min_replicas must be >= 0")
        if self.replica_timeout <= 0:
            raise ValueError("replica_timeout must be > 0 (a WAIT with timeout 0 blocks forever)")
        if self.min_replicas and self.replica_timeout >= self.socket_timeout:
            # The WAIT's reply is read with the connection's socket timeout: a WAIT allowed to
            # block longer would look like a dead connection. (No WAIT is sent without
            # min_replicas, so the default replica_timeout constrains nothing then.)
            raise ValueError(
                "replica_timeout must be shorter than the socket timeout "
                f"(block_timeout + socket_timeout_margin = {self.socket_timeout:g} s)"
            )
        # The holder renews once per sweep it runs, every sweep_period: a lease no longer than
        # that would lapse between two renewals of a live holder.
        if self.sweep_lease_ttl is not None and self.sweep_lease_ttl <= self.sweep_period:
            raise ValueError("sweep_lease_ttl must exceed the sweep period (sweep_interval, "
                             "rounded up to a multiple of heartbeat_interval)")

    @property
    def socket_timeout(self) -> float:
        return self.block_timeout + self.socket_timeout_margin

    @property
    def replica_timeout_ms(self) -> int:
        """WAIT's timeout argument: whole milliseconds, at least 1 (0 would block forever)."""
        return max(1, round(self.replica_timeout * 1000))

    @property
    def sweep_period(self) -> float:
        """The time between two sweeps of one server's background loop: it wakes every
        heartbeat_interval and sweeps at the first wake at least sweep_interval after the last
        sweep (the small epsilon keeps 2.1 / 0.3 = 7.000000000000001 from rounding up to 8)."""
        wakes = max(1, math.ceil(self.sweep_interval / self.heartbeat_interval - 1e-9))
        return wakes * self.heartbeat_interval

    @property
    def lease_ttl(self) -> float:
        if self.sweep_lease_ttl is not None:
            return self.sweep_lease_ttl
        return 3 * self.sweep_period
