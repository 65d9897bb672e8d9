"""Shared plumbing: a throwaway redis-server, server-side command counting, the driver handshake.

Every workload (our cycle, the raw floors, each peer) runs as its own subprocess, a *driver*, which
speaks one small line protocol on stdin/stdout with the harness:

1. the driver connects to the throwaway server and enqueues its tasks, then prints one JSON line
   ``{"event": "enqueued", ...}`` and waits for a line on stdin;
2. the harness resets the server's statistics (``CONFIG RESETSTAT``) and writes ``go``;
3. the driver starts its workers, and whichever worker completes the last task notes the time and
   snapshots ``INFO all`` on a connection opened before the reset, then prints one JSON line
   ``{"event": "done", "tasks": N, "seconds": S, "info": {...}}``.

So the timed window is "first take to last completion", and the server's counters cover exactly
that window: no enqueueing, no idle polling after the drain, no worker shutdown.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: have the kernel SIGTERM the child when the benchmark process dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class RedisServer:
    """A redis-server of our own on 127.0.0.1 and a free port, nothing on disk, stopped by pid:
    `taskcustody.verify.embedded`'s throwaway server (the tests' own), with quiet logs, the DEBUG
    command when a workload asks for it, and a client."""

    def __init__(
        self,
        *,
        debug_command: bool = True,
        binary: str = "redis-server",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        import redis

        from taskcustody.verify.embedded import RedisServerProcess

        args = ("--loglevel", "warning", "--logfile", "")
        if debug_command:
            args += ("--enable-debug-command", "local")
        self.server = RedisServerProcess(extra_args=args + tuple(extra_args), binary=binary).start()
        self.port = self.server.port
        self.url = self.server.url
        self.client = redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)
        self.version = str(self.client.info("server")["redis_version"])

    def flush(self) -> None:
        self.client.flushall()
        self.client.config_resetstat()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        self.server.stop()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- server-side counting -----------------------------------------------------------------

SCRIPT_COMMANDS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}
HARNESS_COMMANDS = {"info", "config|resetstat", "config"}


def normalise_info(info: dict[str, Any]) -> dict[str, Any]:
    """Reduce redis-py's parsed ``INFO all`` to ``{"commands": {name: calls}, "reads": n}``."""
    commands: dict[str, int] = {}
    for key, value in info.items():
        if not key.startswith("cmdstat_"):
            continue
        name = key[len("cmdstat_") :]
        if isinstance(value, dict):
            calls = int(value.get("calls", 0))
        else:  # very old redis-py: "calls=1,usec=..."
            parts = dict(p.split("=", 1) for p in str(value).split(","))
            calls = int(parts.get("calls", 0))
        commands[name] = calls
    return {"commands": commands, "reads": int(info.get("total_reads_processed", 0))}


@dataclass
class Counts:
    """Server-side counts for one drain, per task."""

    tasks: int
    round_trips: float  # socket reads the server processed (a pipeline or script call is one)
    commands: float  # every command, including those a Lua script ran
    scripts: float  # EVAL/EVALSHA/FCALL calls
    by_command: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_info(cls, tasks: int, info: dict[str, Any]) -> Counts:
        cmds = {k: v for k, v in info["commands"].items() if k not in HARNESS_COMMANDS}
        harness_reads = 1  # the final INFO itself
        total = sum(cmds.values())
        scripts = sum(v for k, v in cmds.items() if k in SCRIPT_COMMANDS)
        n = max(tasks, 1)
        return cls(
            tasks=tasks,
            round_trips=(info["reads"] - harness_reads) / n,
            commands=total / n,
            scripts=scripts / n,
            by_command={k: v / n for k, v in sorted(cmds.items(), key=lambda kv: -kv[1])},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "round_trips": self.round_trips,
            "commands": self.commands,
            "scripts": self.scripts,
            "by_command": self.by_command,
        }


def counts_since_reset(admin: Any) -> dict[str, Any]:
    """What the server did since `CONFIG RESETSTAT`, read with one `INFO all` on `admin` (whose
    own RESETSTAT and INFO are left out): commands (including those Lua scripts ran), script
    calls, socket reads (the INFO's own read subtracted) and the commands by name."""
    info = normalise_info(admin.info("all"))
    cmds = {k: v for k, v in info["commands"].items() if k not in HARNESS_COMMANDS}
    return {
        "commands": sum(cmds.values()),
        "scripts": sum(v for k, v in cmds.items() if k in SCRIPT_COMMANDS),
        "reads": info["reads"] - 1,
        "by_command": dict(sorted(cmds.items(), key=lambda kv: -kv[1])),
    }


# --- client-side counting -------------------------------------------------------------------


@dataclass
class WriteCounter:
    """Requests a client sent, counted on the client. redis-py sends a command, a pipeline or a
    script call in one `send_packed_command` and reads its replies before it sends the next (for
    the sequential code this counts), so writes are round trips. The server's
    `total_reads_processed` can count more: it reads a large request in pieces."""

    writes: int = 0


def counting_client(client: Any) -> tuple[Any, WriteCounter]:
    """A client configured like `client` (same URL, timeouts, retry policy) whose connections
    count their writes. Send a first command before counting from zero: a new connection's
    handshake (HELLO, CLIENT SETINFO) is writes too."""
    import redis

    counter = WriteCounter()
    pool = client.connection_pool

    class Counting(pool.connection_class):  # type: ignore[name-defined,misc]
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            counter.writes += 1
            super().send_packed_command(command, check_health)

    counted = redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=Counting, **pool.connection_kwargs)
    )
    return counted, counter


# --- running a driver -----------------------------------------------------------------------


@dataclass
class DriveResult:
    tasks: int
    seconds: float
    counts: Counts | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds if self.seconds > 0 else 0.0


class DriverError(RuntimeError):
    pass


def run_driver(
    argv: Sequence[str],
    server: RedisServer,
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> DriveResult:
    """Run one driver through the handshake against ``server`` (flushed first)."""
    server.flush()
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_DIR)] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else [])
    )
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    errfile = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errfile,
        text=True,
        env=full_env,
        cwd=str(REPO_DIR),
        preexec_fn=_die_with_parent,
    )
    assert proc.stdin is not None and proc.stdout is not None
    deadline = time.monotonic() + timeout
    done: dict[str, Any] | None = None
    announced: dict[str, Any] = {}
    try:
        while True:
            line = _readline(proc, deadline)
            if line is None:
                break
            line = line.strip()
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if msg.get("event") == "enqueued":
                announced = msg
                server.client.config_resetstat()
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif msg.get("event") == "done":
                done = msg
                break
    finally:
        # The driver's work is done once it reported: give it a moment to exit by itself (idle
        # workers finish their blocking take), then stop it.
        stop_driver(proc, 2.0 if done else max(1.0, min(30.0, deadline - time.monotonic())))
    errfile.seek(0)
    err = errfile.read()
    errfile.close()
    if done is None:
        raise DriverError(f"{' '.join(argv)} failed (rc={proc.returncode}):\n{err[-3000:]}")
    if log and err.strip():
        log(err[-2000:])
    counts = Counts.from_info(int(done["tasks"]), done["info"]) if done.get("info") else None
    extra = {
        k: v
        for k, v in (announced | done).items()
        if k not in {"event", "tasks", "seconds", "info"}
    }
    return DriveResult(
        tasks=int(done["tasks"]), seconds=float(done["seconds"]), counts=counts, extra=extra
    )


def _readline(proc: subprocess.Popen[str], deadline: float) -> str | None:
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                proc.kill()
                raise DriverError("driver timed out")
            if sel.select(min(remaining, 1.0)):
                line = proc.stdout.readline()
                return line if line else None
            if proc.poll() is not None:
                rest = proc.stdout.readline()
                return rest if rest else None
    finally:
        sel.close()


def python_in_main_env() -> str:
    return sys.executable


# -- the command lines of the single-purpose benches (registry_gc, sweep_load) ------------------


def rerender(path: Path, render: Callable[[dict[str, Any]], str]) -> int:
    """`--render JSON`: rewrite the .md beside a results file from it, measuring nothing."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return 1
    path.with_suffix(".md").write_text(render(result))
    return 0


def parse_sizes(ap: argparse.ArgumentParser, text: str) -> list[int]:
    """`--sizes 0,1000,100000`, or one clear usage error."""
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        ap.error(f"--sizes must be comma-separated integers, not {text!r}")


def stop_driver(proc: subprocess.Popen[str], wait: float) -> None:
    """Close a driver's stdin (its signal to finish), wait up to `wait` seconds for it to exit,
    then terminate it, then kill it."""
    with contextlib.suppress(Exception):
        if proc.stdin:
            proc.stdin.close()
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
