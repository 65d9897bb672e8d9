"""Retry delays: the backoff schedule and the promotion of due retries (docs/protocol.md,
section 10).

A failed attempt below `max_attempts` is not pushed back on the queue at once: the release script
puts it in the scheduled set (`P:{Q}:scheduled`, a sorted set scored by due time), in the same
atomic step that gives up custody. `promote` moves every due member to the queue in one script.
The server's background loop promotes at every tick, and `taskcustody sweep` promotes; the take
path never does, so a busy worker's cycle gains no command and no round trip.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import redis

from . import scripts
from .keys import QueueKeys
from .settings import Settings

#: Members one promotion moves at most (the rest wait for the next tick, a few seconds later).
PROMOTE_BATCH = 100


def backoff_cap(attempt: int, settings: Settings) -> float:
    """The upper bound of the delay after failed attempt `attempt` (from 1):
    min(retry_backoff_max, retry_backoff * 2**(attempt-1))."""
    if settings.retry_backoff <= 0:
        return 0.0
    exponent = max(0, attempt - 1)
    if exponent >= 64:  # 2**64 seconds exceeds any sane maximum
        return settings.retry_backoff_max
    return min(settings.retry_backoff_max, settings.retry_backoff * 2.0**exponent)


def retry_delay(
    attempt: int, settings: Settings, uniform: Callable[[float, float], float] = random.uniform
) -> float:
    """The delay before retrying after failed attempt `attempt`, with *full jitter*: uniform in
    [0, cap]. Full rather than equal jitter: tasks that fail together (a dependency went down)
    spread over the whole window instead of coming back in a block at cap/2, and the expected
    wait is half the cap, the least of the usual schemes for the same spread."""
    cap = backoff_cap(attempt, settings)
    if cap <= 0:
        return 0.0
    return min(cap, max(0.0, uniform(0.0, cap)))


def promote(client: redis.Redis, keys: QueueKeys, now: float, batch: int = PROMOTE_BATCH) -> int:
    """Move every retry due by `now` (at most `batch`) from the scheduled set to the queue, or to
    the suspects list if it has a recovery count, in one atomic script. Needs no lease: two
    promoters race only on each member's ZREM. Returns how many moved."""
    moved = client.eval(
        scripts.PROMOTE,
        4,
        keys.scheduled,
        keys.queue,
        keys.suspects,
        keys.recoveries,
        repr(float(now)),
        batch,
    )
    return int(moved)


def scheduled_count(client: redis.Redis, keys: QueueKeys) -> int:
    return int(client.zcard(keys.scheduled))
