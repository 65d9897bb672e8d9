"""Redis out of memory (`maxmemory` reached under `noeviction`): a wait, not a crash.

What Redis 7.0.15 does over its limit (seen on a throwaway `redis-server --maxmemory 2mb
--maxmemory-policy noeviction`; tests/test_oom.py pins each of these):

* Commands that may grow memory (flag `denyoom`: LPUSH, BLMOVE, LMOVE, SADD, HSET, ZADD, INCR,
  SET...) are refused before they run: `-OOM command not allowed when used memory >
  'maxmemory'` (redis-py: `OutOfMemoryError`, a `ResponseError`). Nothing happened.
  Commands that only shrink or read (LREM, HDEL, ZREM, SREM, DEL, LLEN, TIME, SCRIPT LOAD) run.
* EVAL/EVALSHA of a script without a `#!lua` flags line are *not* refused up front. Inside, the
  first `denyoom` call is refused only if the script has not written yet; after any write call
  (even an LREM that removed nothing) Redis lets the rest run, so that a script never stops
  half-way for lack of memory. An OOM from a script therefore means it wrote nothing. For ours:
  TAKE_AND_RECORD (ZADD first), DRAIN_CHUNK (LMOVE first), RECORD (HSET), HEARTBEAT (HSET) and
  CLAIM (HSET) are refused whole; RELEASE (LREM first) and REQUEUE_STUCK (LREM first) run to the
  end, so a release under OOM still commits or requeues; DEREGISTER and PRUNE only delete.
* Inside MULTI every command is refused (we use no MULTI).

So an OOM reply is the one error whose outcome we know: the step did not run. The worker backs off
and carries on when memory frees; it logs that once per `oom_log_interval` of its injected clock.
"""

from __future__ import annotations

import logging

import redis

from ..core.clock import Clock

#: The first pause after a refusal, then doubled per refusal in a row up to MAX_PAUSE: a worker
#: carries on within seconds once memory frees, and asks Redis no more than every few seconds
#: while it does not.
FIRST_PAUSE = 1.0
MAX_PAUSE = 5.0


def is_oom(exc: BaseException) -> bool:
    """A Redis OOM refusal. redis-py >= 4.2 raises OutOfMemoryError; older ones a ResponseError
    whose text starts with the error code. Redis 6.2 refuses a command inside a script with a
    script error that quotes it ("Error running script ... -OOM command not allowed when used
    memory > 'maxmemory'"): the script stopped at its first write, so it wrote nothing."""
    oom_error = getattr(redis.exceptions, "OutOfMemoryError", None)
    if oom_error is not None and isinstance(exc, oom_error):
        return True
    if not isinstance(exc, redis.ResponseError):
        return False
    text = str(exc)
    return text.startswith("OOM ") or "-OOM command not allowed" in text


class OomSpell:
    """Back-off and log throttling for one loop (a worker, the heartbeat loop) while Redis refuses
    writes. `refused()` returns how long to wait; `recovered()` ends the spell."""

    def __init__(
        self,
        logger: logging.Logger,
        who: str,
        clock: Clock,
        interval: float,
        first_pause: float = FIRST_PAUSE,
    ) -> None:
        self.logger = logger
        self.who = who
        self.clock = clock
        self.interval = interval
        self.first_pause = min(first_pause, MAX_PAUSE)
        self.refusals = 0  # in the current spell
        self.warned = False  # in the current spell
        self._pause = self.first_pause
        # Kept across spells: a memory level flapping around the limit still logs at most once
        # per interval.
        self._last_logged: float | None = None

    def refused(self, exc: BaseException) -> float:
        self.refusals += 1
        now = self._now()
        if now is not None and self._log_due(now, exc):
            self._last_logged = now
            self.warned = True
            self._warn(exc)
        pause = self._pause
        self._pause = min(self._pause * 2, MAX_PAUSE)
        return pause

    def recovered(self) -> None:
        if self.refusals and self.warned:
            self._recovered_line()
        self.refusals = 0
        self.warned = False
        self._pause = self.first_pause

    def _log_due(self, now: float, exc: BaseException) -> bool:
        return self._last_logged is None or now - self._last_logged >= self.interval

    def _warn(self, exc: BaseException) -> None:
        self.logger.warning(
            "%s: Redis is out of memory (%s); nothing was written, waiting for memory to "
            "free (%d refusal(s) in this spell; logged at most every %g s)",
            self.who,
            exc,
            self.refusals,
            self.interval,
        )

    def _recovered_line(self) -> None:
        self.logger.info(
            "%s: Redis accepts writes again after %d refusal(s)", self.who, self.refusals
        )

    def _now(self) -> float | None:
        try:
            return self.clock.now()
        except redis.RedisError:
            # A RedisClock that cannot reach Redis: skip this log line rather than crash the
            # loop (the unreachable Redis is logged by the loop itself).
            return None
