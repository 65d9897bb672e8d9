"""Tunables of a queue deployment, with the constraints between them checked up front.

Every numeric field is checked against what Redis, Python and the scripts accept, so that a value
that would fail later (in a script half-way through a release, in a socket, in a thread's wait) is
refused here, before anything is taken. The bounds, and why:

* every duration (seconds) is a finite number no larger than MAX_SECONDS, and the socket timeout
  (block_timeout + socket_timeout_margin) no larger than MAX_SOCKET_TIMEOUT: Python waits on a
  socket with poll(2), whose timeout is a C int of milliseconds. A longer timeout is accepted by
  `socket.settimeout` and then wraps around (CPython 3.11, Linux: 4294967.297 s fires after
  1 ms; 2147483.648 s becomes a negative int, which poll(2) takes as no timeout), so a healthy
  blocked take would look like a dead connection, or a dead connection would hang a worker for
  good;
* result_ttl (whole seconds, a Redis `SET ... EX`) is at most MAX_RESULT_TTL: Redis refuses an EX
  above LLONG_MAX / 1000 or one that overflows when added to its clock in milliseconds ("invalid
  expire time in 'set' command"); 10**15 s stays below that for millions of years, and is exact
  as a Lua number (a double), so the release script can check it too
  (lua/lib/release_arguments_checked.lua);
* counts are whole numbers no larger than MAX_COUNT (2**53: the scripts compare them as Lua
  numbers, exact up to there), prefetch no larger than MAX_PREFETCH.

A refusal is a SettingsError (a ValueError) that names the fields it is about; the CLI renders
those names as the flags the user typed (cli/app.py).
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from dataclasses import dataclass

# The longest result TTL (10**15 s): the release script checks it too, so it lives with the
# scripts.
from .scripts import MAX_RESULT_TTL

#: The longest socket timeout a worker's connection can have: (2**31 - 1) ms, the largest C int
#: poll(2) takes, rounded down to whole seconds (24 days 20 hours).
MAX_SOCKET_TIMEOUT = 2_147_483.0
#: The longest of any duration: the socket's bound, one rule for every wait (a thread's own waits
#: go further: threading.TIMEOUT_MAX, some 292 years on Linux, 49.7 days on Windows).
MAX_SECONDS = MAX_SOCKET_TIMEOUT
#: The largest count: the scripts compare counts as Lua numbers (doubles), exact up to 2**53.
MAX_COUNT = 2**53
#: The most slots a prefetching worker thread may have.
MAX_PREFETCH = 1_000

# The fields checked as durations (seconds) and as counts (whole numbers).
_DURATIONS = (
    "block_timeout",
    "socket_timeout_margin",
    "heartbeat_interval",
    "server_ttl",
    "sweep_interval",
    "sweep_lease_ttl",
    "retry_backoff",
    "retry_backoff_max",
    "shutdown_grace",
    "registry_grace",
    "oom_log_interval",
    "replica_timeout",
)
_COUNTS = ("max_attempts", "max_recoveries", "drain_chunk", "prefetch", "min_replicas")


class SettingsError(ValueError):
    """A Settings value out of bounds. The message is a template whose `{field}` placeholders
    name the fields it is about (`fields`); `str()` reads them as field names, `render(names)`
    as `names[field]` where given (the CLI passes its flags: `--server-ttl must exceed
    --heartbeat-interval`). Other placeholders are filled from `values`. `given`: the value each
    field named had (filled in by Settings), for a reader that cannot set that field."""

    def __init__(self, template: str, **values: str) -> None:
        self.template = template
        self.values = values
        self.fields = tuple(
            dict.fromkeys(
                name
                for _, name, _, _ in string.Formatter().parse(template)
                if name and name not in values
            )
        )
        self.given: dict[str, object] = {}
        super().__init__(self.render({}))

    def render(self, names: Mapping[str, str]) -> str:
        return self.template.format(
            **{field: names.get(field, field) for field in self.fields}, **self.values
        )


def _number(name: str, value: object, optional: bool = False) -> None:
    """A duration: a real number (not a bool), finite, at most MAX_SECONDS (its lower bound is
    the field's own check)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SettingsError(
            f"{{{name}}} must be a finite number of seconds, not {{value}}", value=repr(value)
        )
    if value > MAX_SECONDS:
        raise SettingsError(
            f"{{{name}}} must be at most {{limit}} s (some 24.8 days: no socket or thread waits "
            "longer), not {value}",
            limit=_seconds(MAX_SECONDS),
            value=_seconds(value),
        )


def _seconds(value: float) -> str:
    """A number of seconds for a message: 2147483, 0.05, 1e+20."""
    return f"{value:.15g}"


def _whole(name: str, value: object, optional: bool = False) -> None:
    """A count: an int (not a bool), at most MAX_COUNT unless it is result_ttl, whose bound is
    tighter (its lower bound is the field's own check)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"{{{name}}} must be a whole number, not {{value}}", value=repr(value))
    if value > MAX_COUNT and name != "result_ttl":
        raise SettingsError(
            f"{{{name}}} must be at most 2**53 (= {{limit}}), not {{value}}",
            limit=f"{MAX_COUNT}",
            value=f"{value}",
        )


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
    # See docs/guides/failover.md for what it does and does not guarantee.
    min_replicas: int = 0
    # Seconds a WAIT may block before it returns short (a producer then raises
    # ReplicationTimeout; a worker logs and carries on). Seconds like every other duration here;
    # sent to Redis in milliseconds.
    replica_timeout: float = 1.0

    def __post_init__(self) -> None:
        try:
            self._check()
        except SettingsError as exc:
            exc.given = {
                field: getattr(self, field) for field in exc.fields if hasattr(self, field)
            }
            raise

    def _check(self) -> None:
        # Types and finiteness first: the range checks below compare numbers, and NaN compares
        # false with everything (`nan <= 0` is False: it would pass them all).
        for name in _DURATIONS:
            _number(name, getattr(self, name), optional=name == "sweep_lease_ttl")
        for name in (*_COUNTS, "result_ttl"):
            _whole(name, getattr(self, name), optional=name == "max_recoveries")
        if self.block_timeout <= 0:
            raise SettingsError("{block_timeout} must be > 0 (0 would block forever)")
        if self.socket_timeout_margin <= 0:
            raise SettingsError("{socket_timeout_margin} must be > 0")
        if self.socket_timeout > MAX_SOCKET_TIMEOUT:
            # Checked before the registry grace: a block too long for any socket is what to fix.
            raise SettingsError(
                "{block_timeout} + {socket_timeout_margin} (the socket timeout, {total} s) must "
                "be at most {limit} s: a socket waits in poll(2), whose timeout (a C int of "
                "milliseconds) wraps around past that",
                total=_seconds(self.socket_timeout),
                limit=_seconds(MAX_SOCKET_TIMEOUT),
            )
        if self.heartbeat_interval <= 0:
            raise SettingsError("{heartbeat_interval} must be > 0")
        if self.server_ttl <= self.heartbeat_interval:
            raise SettingsError("{server_ttl} must exceed {heartbeat_interval}")
        if self.sweep_interval <= 0:
            raise SettingsError("{sweep_interval} must be > 0")
        if self.max_attempts < 1:
            raise SettingsError("{max_attempts} must be >= 1")
        if self.retry_backoff < 0:
            raise SettingsError("{retry_backoff} must be >= 0 (0: retry at once)")
        if self.retry_backoff_max < self.retry_backoff:
            raise SettingsError("{retry_backoff_max} must be >= {retry_backoff}")
        if self.max_recoveries is not None and self.max_recoveries < 0:
            raise SettingsError("{max_recoveries} must be >= 0 (or None: never dead-letter)")
        if self.prefetch < 1:
            raise SettingsError("{prefetch} must be >= 1")
        if self.prefetch > MAX_PREFETCH:
            raise SettingsError(
                "{prefetch} must be at most {limit}: each slot is an in-flight list that the "
                "claim and every heartbeat name in one script",
                limit=f"{MAX_PREFETCH}",
            )
        if self.oom_log_interval <= 0:
            raise SettingsError("{oom_log_interval} must be > 0")
        if self.result_ttl < 0:
            raise SettingsError("{result_ttl} must be >= 0 (0 stores no results)")
        if self.result_ttl > MAX_RESULT_TTL:
            raise SettingsError(
                "{result_ttl} must be at most {limit} s (some 31 million years): the result's "
                "SET EX must stay within the expiry Redis accepts",
                limit=f"{MAX_RESULT_TTL}",
            )
        if self.drain_chunk < 1:
            raise SettingsError("{drain_chunk} must be >= 1")
        if self.shutdown_grace < 0:
            raise SettingsError("{shutdown_grace} must be >= 0")
        if self.registry_grace < 0:
            raise SettingsError("{registry_grace} must be >= 0 (0 turns the age check off)")
        if self.registry_grace != 0 and (
            self.registry_grace <= self.block_timeout + self.socket_timeout_margin
        ):
            raise SettingsError(
                "{registry_grace} must exceed {block_timeout} + {socket_timeout_margin}: a take "
                "may be pending that long"
            )
        if self.min_replicas < 0:
            raise SettingsError("{min_replicas} must be >= 0")
        if self.replica_timeout <= 0:
            raise SettingsError(
                "{replica_timeout} must be > 0 (a WAIT with timeout 0 blocks forever)"
            )
        if self.min_replicas and self.replica_timeout >= self.socket_timeout:
            # The WAIT's reply is read with the connection's socket timeout: a WAIT allowed to
            # block longer would look like a dead connection. (No WAIT is sent without
            # min_replicas, so the default replica_timeout constrains nothing then.)
            raise SettingsError(
                "{replica_timeout} must be shorter than the socket timeout "
                "({block_timeout} + {socket_timeout_margin} = {total} s)",
                total=_seconds(self.socket_timeout),
            )
        # The holder renews once per sweep it runs, every sweep_period: a lease no longer than
        # that would lapse between two renewals of a live holder.
        if self.sweep_lease_ttl is not None and self.sweep_lease_ttl <= self.sweep_period:
            raise SettingsError(
                "{sweep_lease_ttl} must exceed the sweep period "
                "({sweep_interval}, rounded up to a multiple of "
                "{heartbeat_interval})"
            )

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
