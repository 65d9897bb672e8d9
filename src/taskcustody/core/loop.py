"""The production loop: cycles of a worker (threaded or prefetching) until it is stopped, with
losing Redis, Redis out of memory, a refused release and a cluster redirect each a wait and a
reconcile, never a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import redis

from ..deploy import cluster
from ..deploy.oom import OomSpell, is_oom
from ..deploy.release_refusals import RefusedReleases
from .clock import Clock
from .errors import ReleaseRefused
from .outcome import log
from .settings import Settings


class Runnable(Protocol):
    """What `run_until_stopped` drives: a `Worker`, or a `PrefetchingWorker`."""

    list_key: str
    dirty: bool
    settings: Settings
    clock: Clock

    def run_once(self, timeout: float | None = None) -> bool: ...

    def finish(self) -> None: ...

    def follow_slot(self, refresh: bool = True) -> None: ...


class Stop(Protocol):
    """The stop event's part the loop uses (a threading.Event; tests record the waits)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def run_until_stopped(
    unit: Runnable, stop: Stop, until_idle: bool, register: Callable[[], None] | None = None
) -> None:
    """The production loop: `register`, then cycles until `stop` is set (or, with `until_idle`,
    until a cycle finds the queue empty). Losing Redis is not a crash: the unit reconciles when it
    is back. Nor is Redis out of memory: the unit waits, logging at most once per
    `oom_log_interval`, and carries on when memory frees. Nor a release Redis refuses
    (`ReleaseRefused`): the same back-off and throttled line, and a reconcile before the next
    take."""
    oom = OomSpell(
        log,
        f"worker {unit.list_key}",
        unit.clock,
        unit.settings.oom_log_interval,
        first_pause=min(1.0, unit.settings.block_timeout),
    )
    refusals = RefusedReleases(
        log,
        f"worker {unit.list_key}",
        unit.clock,
        unit.settings.oom_log_interval,
        first_pause=min(1.0, unit.settings.block_timeout),
    )
    redirected = cluster.Backoff()
    if register is not None:
        # The unit's set-up (loading its scripts) comes before any take, whatever: the first
        # attempt is made even if already stopped, and under OOM it is retried until it works
        # or we are stopped. (Its lists are registered by the claim and by every take.)
        while True:
            try:
                register()
                break
            except redis.ResponseError as exc:
                if not is_oom(exc):
                    raise
                stop.wait(oom.refused(exc))
                if stop.is_set():
                    return
    while not stop.is_set():
        try:
            handled = unit.run_once()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("worker %s: Redis unreachable (%s); will reconcile", unit.list_key, exc)
            unit.dirty = True
            stop.wait(min(1.0, unit.settings.block_timeout))
            _follow(unit)  # on a cluster the slot may have failed over to another node
            continue
        except ReleaseRefused as exc:
            # Not a crash (the supervisor would restart us into the same refusal, one traceback
            # per task): the task is in our list, not committed; dirty, the next cycle drains it
            # back to the queue before it takes, as after a crash.
            unit.dirty = True
            stop.wait(refusals.refused(exc))
            continue
        except (
            redis.ResponseError,
            redis.exceptions.ClusterError,
            redis.exceptions.RedisClusterException,
        ) as exc:
            kind = cluster.redirect_kind(exc)
            if kind is not None:
                # The redirected command did not run (cluster.py); whatever ran before it in
                # this cycle is in our list: dirty, so the next cycle reconciles first. Never a
                # crash, never the handler's failure.
                if redirected.count == 0:
                    log.warning("worker %s: %s; following the slot", unit.list_key, exc)
                unit.dirty = True
                stop.wait(redirected.next())
                if kind == cluster.MOVED:
                    _follow(unit)
                continue
            if not is_oom(exc):
                raise
            assert isinstance(exc, redis.ResponseError)
            # The refused command did not run (see oom.py). A refused take or reconcile left
            # nothing behind; a refused release would have left its task in our list, not
            # committed: dirty makes the next cycle drain it back to the queue (once memory
            # frees) before taking anything, so it is run again and committed once. An empty
            # list makes that reconcile one LLEN.
            unit.dirty = True
            stop.wait(oom.refused(exc))
            continue
        oom.recovered()
        refusals.recovered()
        redirected.reset()
        if until_idle and not handled:
            return
    # Stopped: a task the last release took (release_and_take) is in our custody already, with
    # its record: run and release it like any current task (within the shutdown grace).
    try:
        unit.finish()
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        log.warning(
            "worker %s: could not finish the task it held (%s); recovery will requeue it",
            unit.list_key,
            exc,
        )


def _follow(unit: Runnable) -> None:
    """Reconnect to the slot's owner; if the cluster cannot tell it now, the next cycle fails
    again and we come back here."""
    try:
        unit.follow_slot()
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        log.warning("worker %s: cannot read the cluster's slot map (%s)", unit.list_key, exc)
