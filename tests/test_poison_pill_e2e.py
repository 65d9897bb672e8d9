"""End to end with real processes on real Redis: a poison pill among ordinary tasks, run by a
fleet of `taskcustody worker` processes that a supervisor (this test) restarts whenever one dies.

The pill (tests/poison_handler.py) kills every process that runs it. Every recovery of a task
from a dead holder's list counts it in `P:{Q}:recoveries`, in the step that moves it; the
recovery that finds the count past --max-recoveries dead-letters the task instead of requeueing
it. So with --max-recoveries M the pill is requeued M times and dead-lettered by the (M+1)-th
recovery: it runs M+1 times, kills M+1 processes, and its dead letter says recoveries = M+1.
After that the fleet runs on with no further deaths.

The fleet runs with one worker per process, with two, and with one prefetching worker (a batch of
4): with more than one task per process, a task the pill's process held dies with the pill; it
becomes a suspect, runs alone, and commits, and only the pill is dead-lettered (before suspects, 3
runs of 8 with 2 workers, and 3 of 7 with `--prefetch 4`, dead-lettered such a bystander with the
pill: tests/test_poison_pill_bystanders.py).

Executions are counted outside Redis (the handler appends and fsyncs a line per execution to a
file per process before it can die), commits by --track-commits. Nothing here waits on timing:
conditions are polled with bounded deadlines, and a crash loop (more deaths than M+1) fails the
test as soon as it is seen.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from taskcustody import Producer, QueueKeys, connect
from tests.poison_handler import POISON
from tests.support.redis_server import RedisServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.real_redis]

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 3  # server processes, each restarted with its own fixed server id
#: (workers per process, prefetch): the pill alone in its process, beside a second worker's task,
#: and in a prefetched batch
SHAPES = {"1-worker": (1, 1), "2-workers": (2, 1), "prefetch-4": (1, 4)}
ORDINARY = 300  # before the pill is dead-lettered (the pill sits in the middle of them)
AFTER = 50  # enqueued once the pill is dead-lettered: all must commit with no death
MAX_RECOVERIES = 3
SERVER_TTL = 1.0
# A restart claims its slot's id as soon as the dead incarnation's lease lapses (<= SERVER_TTL),
# then its startup drain recovers its own debris; this only bounds that wait.
WAIT_FOR_ID = 10.0
LIMIT = 60.0  # generous bound on each wait: the test fails instead of hanging


@dataclass
class Fleet:
    """The server processes, one per slot, and the supervisor that restarts a dead one."""

    url: str
    log_dir: Path
    max_recoveries: int
    workers: int = 1
    prefetch: int = 1
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    deaths: list[tuple[str, int]] = field(default_factory=list)  # (slot, return code)
    starts: int = 0

    def start(self, slot: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), TASKCUSTODY_POISON_LOG_DIR=str(self.log_dir))
        self.starts += 1
        with open(self.log_dir / f"server-{slot}-{self.starts}.err", "wb") as stderr:
            self.procs[slot] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "taskcustody.cli",
                    "worker",
                    "tests.poison_handler:handle",
                    "--queue",
                    "poison",
                    "--redis-url",
                    self.url,
                    "--workers",
                    str(self.workers),
                    "--prefetch",
                    str(self.prefetch),
                    "--server-id",
                    slot,
                    "--heartbeat-interval",
                    "0.2",
                    "--server-ttl",
                    str(SERVER_TTL),
                    "--sweep-interval",
                    "0.3",
                    "--block-timeout",
                    "0.2",
                    "--wait-for-id",
                    str(WAIT_FOR_ID),
                    "--track-commits",
                    "--max-recoveries",
                    str(self.max_recoveries),
                    "--verbose",
                ],
                env=env,
                cwd=ROOT,
                stderr=stderr,
            )

    def supervise(self) -> None:
        """Restart every process that died; a crash loop (more deaths than the pill may cause)
        fails at once, so a fleet without the bound fails fast instead of looping to the
        deadline."""
        for slot, proc in list(self.procs.items()):
            code = proc.poll()
            if code is not None:
                self.deaths.append((slot, code))
                self.start(slot)
        if len(self.deaths) > self.max_recoveries + 1:
            raise AssertionError(
                f"crash loop: {len(self.deaths)} process deaths {self.deaths}, more than the "
                f"{self.max_recoveries + 1} runs the poison pill may have"
            )

    def heartbeats(self, keys: QueueKeys) -> dict[str, float]:
        """Each slot's heartbeat deadline (0 while its id is not registered)."""
        admin = redis.Redis.from_url(self.url)
        try:
            return {slot: float(admin.zscore(keys.servers, slot) or 0) for slot in self.procs}
        finally:
            admin.close()

    def stop(self) -> list[int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in self.procs.values():
            try:
                codes.append(proc.wait(30))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait(10))
        return codes

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        """Supervise until a condition holds (a bounded poll, not a timed assertion)."""
        deadline = time.monotonic() + LIMIT
        while True:
            self.supervise()
            if predicate():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}; deaths so far: {self.deaths}")
            time.sleep(0.05)


def executions(log_dir: Path) -> Counter[str]:
    """Every execution any process recorded: payload "n" -> how many times it ran."""
    runs: Counter[str] = Counter()
    for path in log_dir.glob("executions-*.log"):
        runs.update(path.read_text().splitlines())
    return runs


def server_logs(log_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted(log_dir.glob("server-*.err")))


def recoveries_logged(text: str) -> int:
    """Tasks the servers' recovery steps took back, as they logged them (--verbose)."""
    startup = sum(int(n) for n in re.findall(r"startup drain requeued (\d+) task", text))
    swept = sum(
        int(a) + int(b)
        for a, b in re.findall(r"sweep: pruned .*?, moved (\d+), requeued stuck (\d+)", text)
    )
    return startup + swept


@pytest.mark.parametrize("shape", list(SHAPES))
def test_poison_pill_is_dead_lettered_after_max_recoveries_and_the_fleet_stops_dying(
    real_redis: RedisServerProcess,
    tmp_path: Path,
    shape: str,
) -> None:
    workers, prefetch = SHAPES[shape]
    began = time.monotonic()
    admin = redis.Redis.from_url(real_redis.url)
    admin.flushall()
    keys = QueueKeys("poison")
    producer = Producer(connect(real_redis.url), keys)
    payloads: list[dict[str, object]] = [{"n": i} for i in range(ORDINARY)]
    payloads.insert(ORDINARY // 2, {"n": POISON, "poison": True})
    ids = producer.enqueue_many(payloads)
    poison_id = ids.pop(ORDINARY // 2)

    def committed() -> int:
        return int(admin.get(keys.committed) or 0)

    def dead_letters() -> list[dict[str, object]]:
        return [json.loads(d) for d in admin.lrange(keys.dead_letters, 0, -1)]

    fleet = Fleet(real_redis.url, tmp_path, MAX_RECOVERIES, workers, prefetch)
    slots = [f"poison-{i}" for i in range(SLOTS)]
    try:
        for slot in slots:
            fleet.start(slot)
        fleet.wait_for(
            lambda: committed() >= ORDINARY and len(dead_letters()) >= 1,
            "every ordinary task to commit and the poison pill to be dead-lettered",
        )
        deaths_at_dead_letter = list(fleet.deaths)
        running = dict(fleet.procs)
        ids += producer.enqueue_many([{"n": ORDINARY + i} for i in range(AFTER)])
        fleet.wait_for(
            lambda: committed() >= ORDINARY + AFTER,
            f"the {AFTER} tasks enqueued after the dead letter to commit",
        )
        fleet.supervise()
        # No process died after the pill was dead-lettered: the same processes still run.
        assert fleet.deaths == deaths_at_dead_letter
        assert fleet.procs == running
        assert all(proc.poll() is None for proc in fleet.procs.values())
        # A SIGTERM before a server installed its handlers (a restart still in its startup drain)
        # would kill it by default: stop only once each has heart-beaten, which comes after.
        fleet.wait_for(lambda: all(fleet.heartbeats(keys).values()), "every server to claim")
        deadlines = fleet.heartbeats(keys)
        fleet.wait_for(
            lambda: all(fleet.heartbeats(keys)[s] > deadlines[s] for s in slots),
            "every server to heart-beat",
        )
        exit_codes = fleet.stop()
    finally:
        fleet.kill_all()
    duration = time.monotonic() - began

    commits = {k.decode(): int(v) for k, v in admin.hgetall(keys.commit_log).items()}
    runs = executions(tmp_path)
    logs = server_logs(tmp_path)
    ordinary_runs = sum(n for k, n in runs.items() if k != POISON)
    print(
        f"\npoison-pill end-to-end: tasks={len(ids) + 1} ({len(ids)} ordinary + 1 pill), "
        f"processes={SLOTS}x{workers} workers (prefetch {prefetch}), "
        f"executions={sum(runs.values())} "
        f"(ordinary {ordinary_runs}, pill {runs[POISON]}), process deaths={len(fleet.deaths)} "
        f"{fleet.deaths}, recoveries={recoveries_logged(logs)} (of the pill "
        f"{dead_letters()[0]['recoveries'] if dead_letters() else None}), "
        f"server starts={fleet.starts}, exit codes at stop={exit_codes}, "
        f"duration={duration:.1f} s"
    )

    # Every ordinary task committed exactly once; the pill never.
    assert sorted(commits) == sorted(ids)
    assert set(commits.values()) == {1}
    assert committed() == len(ids)
    assert all(runs[str(i)] >= 1 for i in range(ORDINARY + AFTER))

    # The pill: requeued MAX_RECOVERIES times, dead-lettered by recovery number MAX_RECOVERIES+1,
    # so it ran (and killed a process) MAX_RECOVERIES + 1 times, and never again.
    [letter] = dead_letters()
    assert letter["task_id"] == poison_id
    assert letter["poison"] is True
    assert letter["recoveries"] == MAX_RECOVERIES + 1
    holders = str(letter["holders"]).split(",")
    assert len(holders) == MAX_RECOVERIES + 1
    assert len(set(holders)) == len(holders)  # each holder a distinct incarnation that died
    assert {h.partition("#")[0] for h in holders} <= set(slots)
    envelope = json.loads(base64.b64decode(str(letter["raw"])))
    assert envelope["id"] == poison_id and envelope["payload"]["poison"] is True
    assert runs[POISON] == MAX_RECOVERIES + 1
    assert len(fleet.deaths) == runs[POISON]
    assert {code for _, code in fleet.deaths} == {1, -signal.SIGKILL}  # both kinds of death
    assert len(re.findall(rf"poison pill: task {poison_id} dead-lettered", logs)) == 1

    # Only the pill was dead-lettered: the tasks that died beside it ran again, alone, and
    # committed (checked above).
    # The pill's count went with its dead letter; the commits deleted the ordinary tasks' counts.
    assert admin.hlen(keys.recoveries) == 0
    # Nothing left anywhere; the fleet shut down cleanly.
    assert admin.llen(keys.queue) == 0 and admin.llen(keys.suspects) == 0
    assert all(admin.llen(k) == 0 for k in admin.zrange(keys.inflight_registry, 0, -1))
    assert admin.hlen(keys.processing) == 0
    assert exit_codes == [0] * SLOTS
