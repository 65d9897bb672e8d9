"""The sweep lease: one sweeper at a time, so the fleet's sweep load grows linearly, not
quadratically, with its size.

Every sweep reads the whole registry (servers, incarnations, in-flight lists, processing records),
so if every server swept every interval, Redis would do servers x registry work per interval.
Under the lease only its holder sweeps; the others pay one small script per interval to learn
that they do not hold it.

The lease is one string key, `P:{Q}:sweep-lease`, holding `<server id>:<incarnation>` with a
Redis PX expiry. Safety never depends on it (any server may sweep at any moment in the model;
restricting who sweeps only removes behaviours); it only has to make sure that *some* live server
keeps sweeping: a holder that dies stops renewing, the key expires, and the next server to try
takes it over. Its expiry is Redis's own timer, so no process's clock is involved; tests drive it
by deleting or expiring the key explicitly.
"""

from __future__ import annotations

import redis

from . import scripts
from .keys import QueueKeys

# The lease's two steps (lua/sweep_lease_acquire_or_renew.lua, lua/sweep_lease_release.lua).
ACQUIRE_OR_RENEW = scripts.SWEEP_LEASE_ACQUIRE_OR_RENEW
RELEASE = scripts.SWEEP_LEASE_RELEASE


def holder_name(server_id: str, incarnation: int) -> str:
    """A lease holder is one incarnation of a server id: a restart of the same id does not inherit
    the previous process's lease (it waits for it to lapse like anyone else)."""
    return f"{server_id}:{incarnation}"


class SweepLease:
    """One server's view of the sweep lease."""

    def __init__(self, client: redis.Redis, keys: QueueKeys, holder: str, ttl: float) -> None:
        if ttl <= 0:
            raise ValueError("the sweep lease's ttl must be > 0")
        self.client = client
        self.key = keys.sweep_lease
        self.holder = holder
        # PX takes whole milliseconds, and 0 would be refused.
        self.ttl_ms = max(1, round(ttl * 1000))

    def acquire_or_renew(self) -> bool:
        """Whether we hold the lease now: renewed if it was ours, taken if nobody held it."""
        return bool(int(self.client.eval(ACQUIRE_OR_RENEW, 1, self.key, self.holder, self.ttl_ms)))

    def release(self) -> bool:
        """Give the lease up if we hold it (clean shutdown), so the next sweeper need not wait
        for it to expire. Whether we held it."""
        return bool(int(self.client.eval(RELEASE, 1, self.key, self.holder)))
