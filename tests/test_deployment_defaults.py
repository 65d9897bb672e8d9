"""Deployment defaults, on real processes and a throwaway redis-server:

- several `taskcustody worker` processes on one host start with no flags (a per-process id);
- the handler's module is found in the current directory, as with `rq worker`;
- SIGTERM stops within --shutdown-grace; a second signal exits at once, leaving its tasks in
  custody, and they are recovered as after a crash (by the sweep of a process started later);
- a process restarted with a stable --server-id after a crash recovers its own debris at start
  without --wait-for-id;
- `-q` is `--queue` in every command.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import redis

from taskcustody import Producer, QueueKeys, connect, get_result
from taskcustody.cli.app import main
from taskcustody.core.keys import check_name
from taskcustody.core.server import default_server_id
from tests.support.redis_server import RedisServerProcess, throwaway_redis_server
from tests.support.waiting import wait_for

pytestmark = pytest.mark.real_redis

QUEUE = "deploy"
KEYS = QueueKeys(QUEUE)
CLI = str(Path(sys.executable).with_name("taskcustody"))  # the console script, as a user runs it

# A handler module that lives only in the test's directory (not on any import path): it marks
# that it started a task, and holds it until the test creates the file `open`.
HANDLER = """
import os, time
HERE = os.path.dirname(os.path.abspath(__file__))

def handle(payload):
    open(os.path.join(HERE, "started-" + payload["name"]), "w").close()
    while not os.path.exists(os.path.join(HERE, "open")):
        time.sleep(0.02)
    return payload["name"]
"""

FAST = [
    "--heartbeat-interval",
    "0.2",
    "--server-ttl",
    "1",
    "--sweep-interval",
    "0.3",
    "--block-timeout",
    "0.1",
    "--registry-grace",
    "5",
]


class WorkerProcess:
    """`taskcustody worker gated:handle` run from `cwd` with JSON logs, its stderr collected."""

    def __init__(self, url: str, cwd: Path, *extra: str) -> None:
        env = {
            k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TASKCUSTODY_SERVER_ID")
        }
        self.proc = subprocess.Popen(
            [
                CLI,
                "worker",
                "gated:handle",
                "-q",
                QUEUE,
                "--redis-url",
                url,
                *FAST,
                "--log-format",
                "json",
                *extra,
            ],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.raw.append(line)
            with contextlib.suppress(ValueError):  # a line that is not JSON: kept in raw
                self.lines.append(json.loads(line))

    def messages(self) -> list[str]:
        return [str(x["message"]) for x in self.lines]

    def said(self, fragment: str) -> bool:
        return any(fragment in m for m in self.messages())

    def banner(self) -> dict[str, Any]:
        wait_for(
            lambda: self.said("started:") or self.proc.poll() is not None,
            "the start banner",
            limit=60,
            state=lambda: self.raw,
        )
        assert self.proc.poll() is None, "".join(self.raw)
        return next(x for x in self.lines if str(x["message"]).startswith("started:"))

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, limit: float = 60) -> int:
        code = self.proc.wait(limit)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def server() -> Iterator[RedisServerProcess]:
    with throwaway_redis_server() as srv:
        yield srv


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "gated.py").write_text(HANDLER)
    return tmp_path


@pytest.fixture
def procs() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for p in started:
        p.kill()


def in_flight(client: redis.Redis) -> dict[str, list[bytes]]:
    return {
        k.decode(): client.lrange(k, 0, -1)
        for k in client.zrange(KEYS.inflight_registry, 0, -1)
        if client.llen(k)
    }


def test_the_default_server_id_is_host_pid_and_a_random_suffix() -> None:
    sid = default_server_id(host="web:1.example.com", pid=42)
    assert re.fullmatch(r"web-1\.example\.com-42-[0-9a-f]{4}", sid)
    assert check_name("server id", sid) == sid
    assert len({default_server_id(host="h", pid=1) for _ in range(50)}) > 40  # random suffix
    assert default_server_id().startswith(
        re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname()).strip(".-")[:48]
    )
    assert default_server_id(host="::", pid=1).startswith("host-1-")


def test_two_processes_on_one_host_start_with_no_flags_and_find_the_handler_in_the_cwd(
    server: RedisServerProcess, here: Path, procs: list[WorkerProcess]
) -> None:
    (here / "open").touch()
    procs += [WorkerProcess(server.url, here), WorkerProcess(server.url, here)]
    banners = [p.banner() for p in procs]
    ids = [b["server_id"] for b in banners]
    assert ids[0] != ids[1]
    for b, p in zip(banners, procs, strict=True):
        assert b["server_id"].endswith(f"-{p.proc.pid}-{b['server_id'][-4:]}")
        assert b["redis_url"] == server.url and b["queue"] == QUEUE
    client = connect(server.url)
    handles = [Producer(client, KEYS).submit({"name": n}) for n in "abcd"]
    assert [h.result(timeout=60) for h in handles] == list("abcd")
    assert {m.decode() for m in client.zrange(KEYS.servers, 0, -1)} == set(ids)
    for p in procs:
        p.signal(signal.SIGTERM)
    assert [p.wait() for p in procs] == [0, 0]
    assert client.zrange(KEYS.servers, 0, -1) == []


def test_a_second_signal_exits_at_once_and_the_task_is_recovered_as_after_a_crash(
    server: RedisServerProcess, here: Path, procs: list[WorkerProcess]
) -> None:
    first = WorkerProcess(server.url, here)
    procs.append(first)
    first.banner()
    client = connect(server.url)
    task_id = Producer(client, KEYS).enqueue({"name": "held"})
    wait_for(lambda: (here / "started-held").exists(), "the handler to start")
    first.signal(signal.SIGTERM)
    wait_for(lambda: first.said("stop taking, finish current tasks within 30s"), "the 1st signal")
    assert first.proc.poll() is None  # finishing its task, within the grace
    first.signal(signal.SIGTERM)
    assert first.wait() == 128 + signal.SIGTERM
    assert first.said("again: exiting now; the tasks in flight stay in custody")
    # As after a crash: the task is in the dead process's in-flight list, not lost, not queued.
    (held,) = in_flight(client).values()
    assert [json.loads(x)["id"] for x in held] == [task_id]
    # A process started later (a new id) recovers it once the dead one's lease lapses.
    (here / "open").touch()
    second = WorkerProcess(server.url, here)
    procs.append(second)
    second.banner()
    assert get_result(client, KEYS, task_id, timeout=60) == "held"
    wait_for(
        lambda: second.said(f"recovery (sweep): task {task_id} moved from"),
        "the sweep's line",
        limit=30,
        state=second.messages,
    )
    second.signal(signal.SIGINT)
    assert second.wait() == 0


def test_shutdown_grace_bounds_the_wait_for_running_tasks(
    server: RedisServerProcess, here: Path, procs: list[WorkerProcess]
) -> None:
    worker = WorkerProcess(server.url, here, "--shutdown-grace", "0.5")
    procs.append(worker)
    assert worker.banner()["shutdown_grace"] == 0.5
    client = connect(server.url)
    task_id = Producer(client, KEYS).enqueue({"name": "slow"})
    wait_for(lambda: (here / "started-slow").exists(), "the handler to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0  # by itself, after the grace, with the handler still running
    assert worker.said("grace period over with tasks still running")
    (held,) = in_flight(client).values()
    assert [json.loads(x)["id"] for x in held] == [task_id]


def test_a_restart_with_a_stable_id_after_a_crash_recovers_its_debris_without_flags(
    server: RedisServerProcess, here: Path, procs: list[WorkerProcess]
) -> None:
    first = WorkerProcess(server.url, here, "--server-id", "web-1")
    procs.append(first)
    first.banner()
    client = connect(server.url)
    task_id = Producer(client, KEYS).enqueue({"name": "crash"})
    wait_for(lambda: (here / "started-crash").exists(), "the handler to start")
    first.signal(signal.SIGKILL)
    first.wait()
    (here / "open").touch()
    # Same id, at once, no --wait-for-id: it waits out the dead process's lease (1 s here)
    # instead of refusing, then its startup drain takes the task back.
    second = WorkerProcess(server.url, here, "--server-id", "web-1")
    procs.append(second)
    assert second.banner()["server_id"] == "web-1"
    assert second.said(f"recovery (startup drain): task {task_id} moved from")
    assert get_result(client, KEYS, task_id, timeout=60) == "crash"
    second.signal(signal.SIGTERM)
    assert second.wait() == 0


def all_commands() -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                subcommand = command.get_command(ctx, sub)
                assert subcommand is not None
                yield f"{name} {sub}", subcommand
        else:
            yield name, command


def test_dash_q_is_queue_in_every_command() -> None:
    with_q = {}
    for name, command in all_commands():
        for param in command.params:
            if "-q" in getattr(param, "opts", ()):
                with_q[name] = param.name
    assert set(with_q.values()) == {"queue"}
    assert {"worker", "enqueue", "status", "sweep", "verify", "result"} <= set(with_q)
