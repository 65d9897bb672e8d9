"""End to end: Redis restarts empty under two running servers, then one of
them is SIGKILLed while it runs a task enqueued after the restart. Real `taskcustody worker`
processes on a real redis-server, both killed and restarted by pid.

Before the fix, the registry of in-flight lists was written once, at server start: the restart
wiped it, the killed server's list (holding its task) was never registered again, and the other
server's sweeps could not find it -- the task was lost. Now every take registers its list, and a
heartbeat that finds its registration gone registers the server's lists again. The second test
restarts Redis while a task is in flight: that task is Redis's loss (it must not commit nor run
again), and the tasks enqueued after must still commit exactly once through a SIGKILL.

Executions are logged to files (one per process, outside Redis), so neither a Redis restart nor a
SIGKILL can hide one. Tasks are held by gates the test opens, so what runs when is the test's
choice, not luck; every wait is a bounded poll of a condition, never a timed assertion.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from taskcustody import Producer, QueueKeys, connect
from taskcustody.core.keys import ListOwner
from tests.support.redis_server import (
    RedisServerProcess,
    redis_server_binary,
    throwaway_redis_server,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.real_redis]

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "q"
# The timings: a server is judged dead 2 s after its last heartbeat, the (lease-holding)
# sweeper sweeps every 0.5 s, and the lease of a dead holder lapses within 3 sweep periods.
TIMINGS = (
    "--heartbeat-interval",
    "0.5",
    "--server-ttl",
    "2",
    "--sweep-interval",
    "0.5",
    "--block-timeout",
    "0.2",
)
LIMIT = 60.0  # for each wait: generous on a shared 2-core machine; recovery needs a few seconds


class Fleet:
    """`taskcustody worker` processes (one worker thread each, their own server ids) on one queue,
    with their execution logs and the gates that hold their tasks."""

    def __init__(self, redis_server: RedisServerProcess, workdir: Path) -> None:
        self.redis_server = redis_server
        self.keys = QueueKeys(QUEUE)
        self.admin = redis.Redis.from_url(redis_server.url)
        self.gates = workdir / "gates"
        self.gates.mkdir()
        self.logs = workdir / "logs"
        self.logs.mkdir()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, server_id: str) -> None:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = dict(
            os.environ,
            PYTHONPATH=path,
            TASKCUSTODY_E2E_LOG=str(self.logs / server_id),
            TASKCUSTODY_E2E_GATES=str(self.gates),
        )
        self.procs[server_id] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "taskcustody.cli",
                "worker",
                "tests.e2e_gated_handler:handle",
                "--queue",
                QUEUE,
                "--redis-url",
                self.redis_server.url,
                "--workers",
                "1",
                "--server-id",
                server_id,
                *TIMINGS,
                "--track-commits",
            ],
            env=env,
            cwd=ROOT,
        )

    def kill(self, server_id: str) -> None:
        proc = self.procs[server_id]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def stop(self, server_id: str) -> int:
        """SIGTERM: finish, deregister; the exit code."""
        proc = self.procs[server_id]
        proc.send_signal(signal.SIGTERM)
        return proc.wait(60)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        self.admin.close()

    def open_gate(self, name: str) -> None:
        (self.gates / name).touch()

    def log(self, server_id: str, event: str) -> list[int]:
        """The task numbers of `event` ("start" or "done") lines in a server's log."""
        path = self.logs / server_id
        if not path.exists():
            return []
        return [
            int(n)
            for e, n in (line.split() for line in path.read_text().splitlines())
            if e == event
        ]

    def count(self, event: str) -> Counter[int]:
        return Counter(n for sid in self.procs for n in self.log(sid, event))

    # -- Redis ---------------------------------------------------------------------------------

    def registered_servers(self) -> set[str]:
        return {s.decode() for s in self.admin.zrange(self.keys.servers, 0, -1)}

    def restart_redis(self) -> None:
        """SIGKILL redis-server and start it again on the same port, empty."""
        marker = "e2e:before-restart"
        self.admin.set(marker, 1)
        pid = self.redis_server.pid
        self.redis_server.restart()
        self.admin.connection_pool.disconnect()  # its sockets went with the old process
        assert self.redis_server.pid != pid
        assert self.admin.get(marker) is None  # the dataset is gone, not just the process

    def enqueue(self, *numbers: int) -> dict[int, str]:
        ids = Producer(connect(self.redis_server.url), self.keys).enqueue_many(
            [{"n": n} for n in numbers]
        )
        return dict(zip(numbers, ids, strict=True))

    def commits(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.admin.hgetall(self.keys.commit_log).items()}

    def inflight_lists_holding_tasks(self) -> dict[str, int]:
        """Every in-flight list of the queue that holds something, registered or not (the lost
        task of the issue sat in a list the registry no longer named)."""
        lengths = {
            k.decode(): int(self.admin.llen(k))
            for k in self.admin.scan_iter(match=f"{self.keys.inflight_prefix}*")
        }
        return {k: n for k, n in lengths.items() if n}

    def custody(self) -> str:
        """Where the tasks are, for a wait that gives up."""
        registry = [k.decode() for k in self.admin.zrange(self.keys.inflight_registry, 0, -1)]
        return (
            f"queue: {self.admin.llen(self.keys.queue)}, in-flight lists holding tasks: "
            f"{self.inflight_lists_holding_tasks()}, registry: {registry}, "
            f"servers: {sorted(self.registered_servers())}, commits: {self.commits()}"
        )

    def registered_list(self, server_id: str) -> str:
        """The in-flight list of `server_id`'s (only) worker, for the incarnation Redis knows."""
        incarnation = self.admin.hget(self.keys.incarnations, server_id)
        assert incarnation is not None, f"{server_id} is not registered"
        return self.keys.inflight(ListOwner(server_id, int(incarnation), "w0"))


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A redis-server of the test's own (it gets restarted) and the worker processes on it, all
    stopped by pid afterwards."""
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    with throwaway_redis_server() as server:
        f = Fleet(server, tmp_path)
        try:
            yield f
        finally:
            f.close()


def start_both(fleet: Fleet) -> None:
    """Start A and B and wait until both are running: past `Server.start`, which a Redis restart
    would interrupt (the process then exits 1, 'cannot reach Redis'), and which the claim's
    registration alone does not show. The heartbeat loop starts only after it, so a heartbeat
    that renews the claim's deadline does."""
    fleet.start("A")
    fleet.start("B")
    first_seen: dict[str, float] = {}

    def renewed() -> bool:
        for sid in ("A", "B"):
            deadline = fleet.admin.zscore(fleet.keys.servers, sid)
            if deadline is None or first_seen.setdefault(sid, deadline) == deadline:
                return False
        return True

    wait_for(renewed, "A and B to register and heart-beat", LIMIT)


def assert_custody_settled(fleet: Fleet, survivor: str) -> None:
    keys, admin = fleet.keys, fleet.admin
    assert admin.llen(keys.queue) == 0
    assert fleet.inflight_lists_holding_tasks() == {}
    assert all(admin.llen(k) == 0 for k in admin.zrange(keys.inflight_registry, 0, -1))
    assert admin.hlen(keys.processing) == 0
    assert admin.llen(keys.dead_letters) == 0
    # The survivor's list is registered again after the restart (by its heartbeat or its take):
    # the registry heals instead of staying empty.
    assert admin.zscore(keys.inflight_registry, fleet.registered_list(survivor)) is not None


def test_a_task_enqueued_after_a_redis_restart_survives_the_sigkill_of_its_server(
    fleet: Fleet,
) -> None:
    start_both(fleet)
    fleet.restart_redis()
    # Both servers are back (their heartbeats found their registration gone) before work arrives.
    wait_for(
        lambda: fleet.registered_servers() == {"A", "B"},
        "A and B to register again after the restart",
        LIMIT,
    )
    ids = fleet.enqueue(0, 1)
    # One worker each, and a held task blocks its worker: each server runs exactly one.
    wait_for(
        lambda: fleet.log("A", "start") and fleet.log("B", "start"),
        "A and B to run a task each",
        LIMIT,
    )
    (a_task,) = fleet.log("A", "start")
    (b_task,) = fleet.log("B", "start")
    assert {a_task, b_task} == {0, 1}

    fleet.kill("A")  # with A's task in its in-flight list
    fleet.open_gate("all")
    wait_for(
        lambda: set(fleet.commits()) == set(ids.values()),
        f"B to commit its task and recover A's (task {a_task})",
        LIMIT,
        fleet.custody,
    )

    assert fleet.commits() == {ids[0]: 1, ids[1]: 1}
    starts, dones = fleet.count("start"), fleet.count("done")
    # Each ran at least once (it committed) and at most twice: A's task once in A, killed
    # before it could finish, and once more in B after the recovery.
    assert all(1 <= starts[n] <= 2 for n in ids), starts
    assert set(dones) == {0, 1}
    assert a_task in fleet.log("B", "done") and a_task not in fleet.log("A", "done")
    assert_custody_settled(fleet, "B")
    assert fleet.stop("B") == 0


def test_a_task_in_flight_across_the_restart_is_lost_and_every_later_one_commits_exactly_once(
    fleet: Fleet,
) -> None:
    start_both(fleet)
    before = fleet.enqueue(0)
    wait_for(lambda: fleet.count("start")[0], "a server to start task 0", LIMIT)
    holder = "A" if fleet.log("A", "start") == [0] else "B"
    other = "B" if holder == "A" else "A"
    fleet.restart_redis()  # task 0 is in `holder`'s in-flight list: Redis loses it
    wait_for(
        lambda: fleet.registered_servers() == {"A", "B"},
        "A and B to register again after the restart",
        LIMIT,
    )
    after = fleet.enqueue(1, 2)
    wait_for(lambda: fleet.log(other, "start"), f"{other} to take a task", LIMIT)
    # `holder` finishes task 0 but cannot commit it (its release went to the Redis that died, or
    # finds the task gone), then takes the other new task into the list that held task 0.
    fleet.open_gate("0")
    wait_for(lambda: len(fleet.log(holder, "start")) == 2, f"{holder} to take a task", LIMIT)
    (held,) = fleet.log(holder, "start")[1:]

    fleet.kill(holder)
    fleet.open_gate("all")
    wait_for(
        lambda: set(after.values()) <= set(fleet.commits()),
        f"{other} to commit its task and recover {holder}'s (task {held})",
        LIMIT,
        fleet.custody,
    )

    # Redis lost task 0 with its data; the commit log holds exactly the tasks enqueued after.
    assert before[0] not in fleet.commits()
    assert fleet.commits() == {after[1]: 1, after[2]: 1}
    starts, dones = fleet.count("start"), fleet.count("done")
    assert starts[0] == 1  # run once, by `holder`: nothing holds it any more to run it again
    assert all(1 <= starts[n] <= 2 for n in after), starts
    assert set(dones) == {0, 1, 2}
    assert held in fleet.log(other, "done") and held not in fleet.log(holder, "done")
    assert_custody_settled(fleet, other)
    assert fleet.stop(other) == 0
