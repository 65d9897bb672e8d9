"""A throwaway redis-server per test session: own port, nothing on disk, stopped by pid.

Used where a test claims something about real Redis, and for faults injected into Redis itself
(pause, stop, kill, restart). The server itself is `taskcustody.verify.embedded`'s (the one
`verify --embedded-redis` starts); this module adds a primary with a replica of its own
(`throwaway_primary_and_replica`).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import redis

# One implementation of a throwaway server, shared with `taskcustody verify --embedded-redis`.
from taskcustody.verify.embedded import (
    SERVER_BINARY_VARIABLE,
    NoServerBinary,
    RedisServerProcess,
    free_port,
    redis_server_binary,
    throwaway_redis_server,
)

__all__ = [
    "PRIMARY_ARGS",
    "REPLICA_ARGS",
    "SERVER_BINARY_VARIABLE",
    "NoServerBinary",
    "RedisServerProcess",
    "free_port",
    "redis_server_binary",
    "replication_info",
    "throwaway_primary_and_replica",
    "throwaway_redis_server",
    "wait_for_replication_link",
]


# Replication without files: the primary streams its snapshot over the socket at once (the default
# waits 5 s for more replicas), and the replica loads it from the socket, so no test writes an RDB
# into the shared /tmp.
PRIMARY_ARGS = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
REPLICA_ARGS = ("--repl-diskless-load", "on-empty-db")


def replication_info(port: int) -> dict[str, object]:
    client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return dict(client.info("replication"))
    finally:
        client.close()


def wait_for_replication_link(
    primary: RedisServerProcess, replica: RedisServerProcess, timeout: float = 30.0
) -> None:
    """Until the replica's link is up and the primary counts it online (a setup wait, not an
    assertion about timing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mine = replication_info(replica.port)
        theirs = replication_info(primary.port)
        slave = theirs.get("slave0")
        online = isinstance(slave, dict) and slave.get("state") == "online"
        if mine.get("master_link_status") == "up" and online:
            return
        time.sleep(0.05)
    raise RuntimeError(f"replica on port {replica.port} never linked to {primary.port}")


@contextlib.contextmanager
def throwaway_primary_and_replica() -> Iterator[tuple[RedisServerProcess, RedisServerProcess]]:
    """A primary and one replica of it, linked; both stopped by pid afterwards (resumed first)."""
    primary = RedisServerProcess(extra_args=PRIMARY_ARGS).start()
    replica: RedisServerProcess | None = None
    try:
        replica = RedisServerProcess(
            extra_args=(*REPLICA_ARGS, "--replicaof", "127.0.0.1", str(primary.port))
        ).start()
        wait_for_replication_link(primary, replica)
        yield primary, replica
    finally:
        for server in (replica, primary):
            if server is not None and server.proc is not None:
                with contextlib.suppress(OSError):
                    server.signal(signal.SIGCONT)
                server.stop()
