"""A release Redis refuses: a wait and one log line, not a crash per task.

Redis may answer a release script with an error reply: an argument it refuses (which the script
checks before its first write, lua/lib/release_arguments_checked.lua), or a command the Redis user
may not run (ACL). Before, such an error left the worker loop, its supervisor logged "crashed;
restarting it" with a traceback and restarted it, and the next task did the same: a crash loop, one
traceback per task. Now the release's error is a `ReleaseRefused`; the production loop marks the
worker dirty (the task is in its in-flight list: the next cycle drains it back to the queue, as
after a crash), waits with the back-off of an OOM spell, and logs the refusal once: again only when
its text changes or `Settings.oom_log_interval` has passed on the injected clock.
"""

from __future__ import annotations

import logging

import redis

from ..core.clock import Clock
from ..core.errors import ReleaseRefused
from . import cluster
from .oom import FIRST_PAUSE, OomSpell, is_oom


def as_refused(exc: redis.ResponseError) -> redis.ResponseError:
    """A release's error reply as a `ReleaseRefused`, unless the loop handles it otherwise: out
    of memory (the step did not run, oom.py) and a cluster redirect (it did not run either, and
    is sent again, cluster.py) are returned as they are."""
    if isinstance(exc, ReleaseRefused) or is_oom(exc) or cluster.redirect_kind(exc) is not None:
        return exc
    return ReleaseRefused(str(exc))


class RefusedReleases(OomSpell):
    """`OomSpell`'s back-off for a worker whose releases Redis refuses, with its own lines: one
    per refusal text, again at most once per interval while it lasts."""

    def __init__(
        self,
        logger: logging.Logger,
        who: str,
        clock: Clock,
        interval: float,
        first_pause: float = FIRST_PAUSE,
    ) -> None:
        super().__init__(logger, who, clock, interval, first_pause)
        self._last_text = ""  # of the refusal logged last

    def _log_due(self, now: float, exc: BaseException) -> bool:
        return str(exc) != self._last_text or super()._log_due(now, exc)

    def _warn(self, exc: BaseException) -> None:
        self._last_text = str(exc)
        self.logger.warning(
            "%s: Redis refused a release (%s); its task stays in this worker's in-flight list, "
            "not committed, and goes back to the queue before the next take; backing off "
            "(%d refusal(s) in a row; logged again when the error changes, or after %g s)",
            self.who,
            exc,
            self.refusals,
            self.interval,
        )

    def _recovered_line(self) -> None:
        self.logger.info(
            "%s: Redis accepts releases again after %d refusal(s)", self.who, self.refusals
        )
