"""Workers, recovery and verify on a real local Redis Cluster (3 masters, 3 replicas), through a
failover, a live slot migration and a SIGKILL of a server.

Three queues whose slots live on three different masters, all reached through one seed node,
each served by a real `taskcustody worker` process. Mid-run: CLUSTER FAILOVER of the first
queue's master, a live migration of the second queue's slot, SIGKILL and restart of the third
queue's server. At the end every task has committed exactly once, no in-flight list holds a task,
and each queue resumed committing after its event (the stalls are measured and printed, not
asserted: timings on a shared machine are figures, not properties).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from taskcustody import Producer, QueueKeys, connect
from taskcustody.cli.app import main
from taskcustody.deploy import cluster
from tests.helpers import commits
from tests.support.redis_cluster import LocalCluster, tags_on_distinct_masters

pytestmark = [pytest.mark.cluster, pytest.mark.real_redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
N = 400  # tasks per queue at the start
#: enqueued to a queue right after its event: work that can only be done after it, whatever was
#: left of the first N then (a fast worker may have drained them all; no timing luck)
EXTRA = 40
TOTAL = N + EXTRA


def start_server(
    seed: str, queue: str, log: Path, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """A `taskcustody worker` process; its log (--verbose: every redirect and recovery action)
    is appended to `log` (a file, not a pipe nobody reads while it runs)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TASKCUSTODY_CLUSTER_URL=seed)
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "taskcustody.cli",
                "worker",
                "tests.cluster_handler:handle",
                "--queue",
                queue,
                "--redis-url",
                seed,
                "--workers",
                "2",
                "--server-id",
                f"e2e-{queue}",
                "--heartbeat-interval",
                "0.2",
                "--server-ttl",
                "1.5",
                "--sweep-interval",
                "0.5",
                "--block-timeout",
                "0.2",
                "--wait-for-id",
                "10",
                "--track-commits",
                "--verbose",
                *extra,
            ],
            env=env,
            cwd=ROOT,
            stderr=out,
        )


def wait_for(predicate: Any, what: str, limit: float = 120.0) -> None:
    """A bounded poll (so that a broken build fails instead of hanging), not a timed assert."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


class CommitSampler:
    """Samples each queue's committed count every 20 ms, to measure the stalls."""

    def __init__(self, client: Any, keys: list[QueueKeys]) -> None:
        self.client = client
        self.keys = keys
        self.samples: dict[str, list[tuple[float, int]]] = {k.queue_name: [] for k in keys}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for k in self.keys:
                try:
                    n = int(self.client.get(k.committed) or 0)
                except Exception:  # a sample lost to the event itself: skip it
                    continue
                self.samples[k.queue_name].append((time.monotonic(), n))
            self.stop.wait(0.02)

    def count(self, queue: str) -> int:
        s = self.samples[queue]
        return s[-1][1] if s else 0

    def stall(self, queue: str, start: float, end: float) -> tuple[float, float]:
        """(longest time without a new commit from `start` until the first commit after `end`,
        time from `end` to that first commit)."""
        s = self.samples[queue]
        last_change = start
        before = max((n for t, n in s if t <= start), default=0)
        longest = 0.0
        for t, n in s:
            if t <= start:
                continue
            if n > before:
                longest = max(longest, t - last_change)
                last_change, before = t, n
                if t >= end:
                    return longest, t - end
        return longest, float("nan")


def enqueue_extra(client: Any, keys: QueueKeys) -> None:
    Producer(client, keys).enqueue_many({"n": i, "q": keys.queue_name} for i in range(N, TOTAL))


def test_three_queues_on_three_masters_through_failover_migration_and_sigkill(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    names = tags_on_distinct_masters(local_cluster, "e2e")
    keys = [QueueKeys(n) for n in names]
    seed = local_cluster.url(0)
    client = connect(seed)
    assert cluster.is_cluster(client)
    owners = {k.queue_name: local_cluster.owner_port(k.queue) for k in keys}
    assert len(set(owners.values())) == 3  # one queue per master
    for k in keys:
        Producer(client, k).enqueue_many({"n": i, "q": k.queue_name} for i in range(N))
    failover_q, migrate_q, kill_q = keys
    logs = {k.queue_name: tmp_path / f"{k.queue_name}.log" for k in keys}
    procs = {
        failover_q.queue_name: start_server(
            seed, failover_q.queue_name, logs[failover_q.queue_name]
        ),
        # the migrating queue is served by prefetching workers
        migrate_q.queue_name: start_server(
            seed, migrate_q.queue_name, logs[migrate_q.queue_name], ("--prefetch", "4")
        ),
        kill_q.queue_name: start_server(seed, kill_q.queue_name, logs[kill_q.queue_name]),
    }
    sampler = CommitSampler(client, keys)
    sampler.thread.start()
    events: dict[str, tuple[float, float]] = {}
    try:
        wait_for(
            lambda: all(sampler.count(k.queue_name) >= N // 5 for k in keys),
            "a fifth of every queue committed",
        )
        t0 = time.monotonic()
        local_cluster.failover(owners[failover_q.queue_name])
        events["failover"] = (t0, time.monotonic())
        enqueue_extra(client, failover_q)
        t0 = time.monotonic()
        source = local_cluster.owner_port(migrate_q.queue)
        target = next(
            p
            for p in local_cluster.master_ports()
            if p not in (source, local_cluster.owner_port(failover_q.queue))
        )
        moved_keys = local_cluster.migrate_slot(
            local_cluster.keyslot(migrate_q.queue), target, pause=0.02
        )
        events["migration"] = (t0, time.monotonic())
        enqueue_extra(client, migrate_q)
        t0 = time.monotonic()
        procs[kill_q.queue_name].kill()
        procs[kill_q.queue_name].wait()
        procs[kill_q.queue_name] = start_server(seed, kill_q.queue_name, logs[kill_q.queue_name])
        events["sigkill"] = (t0, time.monotonic())
        enqueue_extra(client, kill_q)
        for k in keys:
            wait_for(
                lambda k=k: int(client.get(k.committed) or 0) >= TOTAL,
                f"every task of {k.queue_name} committed",
            )
    finally:
        sampler.stop.set()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    stderr = {q: path.read_text() for q, path in logs.items()}
    figures = []
    for (event, (start, end)), k in zip(events.items(), keys, strict=True):
        done = commits(client, k)
        executions = client.hgetall(f"e2e:{{{k.queue_name}}}:executions")
        ran = sum(int(v) for v in executions.values())
        # every task committed exactly once ...
        assert len(done) == TOTAL and set(done.values()) == {1}, (k.queue_name, stderr)
        assert int(client.get(k.committed)) == TOTAL
        # ... every task ran (at least once), nothing is left in custody or in the queue
        assert len(executions) == TOTAL
        assert client.llen(k.queue) == 0
        lists = cluster.tag_keys(client, k.queue, k.inflight_prefix)
        assert all(client.llen(name.decode()) == 0 for name in lists)
        # ... and the queue committed again after its event
        longest, resumed = sampler.stall(k.queue_name, start, end)
        assert resumed == resumed, f"{k.queue_name} never committed after the {event}"
        log = stderr[k.queue_name]
        figures.append(
            f"{event} ({k.queue_name}): event {end - start:.2f} s, first commit "
            f"{resumed:.2f} s after it, longest stall {longest:.2f} s; "
            f"{TOTAL} tasks, {len(done)} committed once, {ran} executions; worker log: "
            f"{log.count('following the slot')} redirect spell(s) in the loop, "
            f"{log.count('release redirected') + log.count('release(s) redirected')}"
            " release redirect(s) sent again, "
            f"{log.count('Redis unreachable')} connection loss(es), "
            f"{log.count('startup drain requeued')} startup drain(s), "
            f"{log.count('crashed')} crash(es)"
        )
        assert "crashed" not in log, log
    assert "Traceback" not in stderr[migrate_q.queue_name] + stderr[failover_q.queue_name]
    print(
        "\ncluster end-to-end (3 masters + 3 replicas, seed " + seed + f", {moved_keys} keys "
        "migrated):\n  " + "\n  ".join(figures)
    )


def test_verify_passes_on_the_cluster_for_a_tag_on_each_master(local_cluster: LocalCluster) -> None:
    seed = local_cluster.url(0)
    for tag in tags_on_distinct_masters(local_cluster, "vfy"):
        result = CliRunner().invoke(
            main,
            [
                "verify",
                "--redis-url",
                seed,
                "--queue",
                tag,
                "--no-model-check",
                "--examples",
                "25",
                "--steps",
                "25",
                "--quiet",
                "--no-fault-coverage",
            ],
        )
        assert result.exit_code == 0, result.output
        assert "VERIFIED" in result.output
        owner = local_cluster.client(local_cluster.owner_port(QueueKeys(tag).queue))
        # cleaned on the master that owns the slot
        slot = local_cluster.keyslot(QueueKeys(tag).queue)
        assert owner.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
