"""The server's eviction policy: refuse one that may delete a queue or an in-flight list.

Our custody keys (queue, in-flight lists, registry, processing records, servers) carry no TTL, so
`noeviction` and the `volatile-*` policies never evict them. An `allkeys-*` policy may evict any
key under memory pressure: a whole queue, or an in-flight list with the only copy of a running
task. That is refused unless the user overrides it, and the override is warned about once per
process per (server, policy): a warning repeated on every connection is noise that hides others.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from ..core.errors import EvictingPolicy

log = logging.getLogger("taskcustody.eviction")

#: Policies Redis documents; any future `allkeys-*` one is refused as well.
EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")

UNREADABLE = "unreadable"

# (server, policy) pairs already warned about in this process. A module-level guard, not one per
# client or per check: every worker thread, CLI call and Server.start of a process shares it.
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def is_evicting(policy: str) -> bool:
    return policy.startswith("allkeys-")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_policy(client: redis.Redis) -> str | None:
    """The server's maxmemory-policy: CONFIG GET, else INFO memory (managed services often rename
    or forbid CONFIG), else None."""
    try:
        reply = client.config_get("maxmemory-policy")
    except redis.ResponseError:  # unknown command (renamed), NOPERM (ACL)
        reply = {}
    for key, value in dict(reply).items():
        if _text(key) == "maxmemory-policy":
            return _text(value)
    try:
        info = client.info("memory")
    except redis.ResponseError:
        return None
    value = info.get("maxmemory_policy")
    return None if value is None else _text(value)


def server_name(client: redis.Redis) -> str:
    """Which server a client talks to, for the once-per-process guard."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def warn_once(server: str, policy: str, message: str) -> bool:
    """Log `message` unless this process already warned about (server, policy). True if logged."""
    with _warned_lock:
        if (server, policy) in _warned:
            return False
        _warned.add((server, policy))
    log.warning("%s", message)
    return True


def check_eviction_policy(client: redis.Redis, *, allow_evicting_policy: bool = False) -> str:
    """Refuse an `allkeys-*` policy (EvictingPolicy) unless allowed; returns the policy read
    (`UNREADABLE` if neither CONFIG GET nor INFO told it, which is warned about once)."""
    policy = read_policy(client)
    server = server_name(client)
    if policy is None:
        warn_once(
            server,
            UNREADABLE,
            f"cannot read maxmemory-policy of Redis at {server} (CONFIG GET and INFO "
            "refused); taskcustody needs noeviction or a volatile-* policy: an allkeys-* "
            "policy may evict a queue or an in-flight list and lose tasks",
        )
        return UNREADABLE
    if is_evicting(policy):
        if not allow_evicting_policy:
            raise EvictingPolicy(policy)
        warn_once(
            server,
            policy,
            f"Redis at {server} has maxmemory-policy {policy}: under memory pressure it "
            "may evict a queue or an in-flight list and lose tasks; going on because the "
            "evicting policy was allowed explicitly",
        )
    return policy
