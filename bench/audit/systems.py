"""The systems under audit: ours and the five peers, each with the command that starts one of its
real, unmodified workers (its own CLI entry point, in its own venv at the pinned version), the
command that enqueues the tasks, the settings and why, and the timing the audit allows it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from bench.harness import REPO_DIR
from bench.peerenv import PEERS, peer_python

APPS_DIR = REPO_DIR / "bench" / "peers" / "audit_apps"


@dataclass(frozen=True)
class System:
    name: str
    label: str
    # How one worker instance starts: argv after the python; "{url}" is replaced.
    worker_args: tuple[str, ...]
    settings: str
    # Seconds after a fault within which the system documents (or, as configured, promises) that
    # every task is run again: a task not completed by then is counted lost.
    recovery_seconds: float
    # How long the stall fault keeps a worker stopped: longer than the timeout after which the
    # system takes a silent worker's task back.
    stall_seconds: float
    stall_reason: str
    unsafe: str = ""  # settings the system documents as unsafe that this audit uses ("" = none)

    def python(self, log: object = None) -> Path:
        if self.name == "taskcustody":
            return Path(sys.executable)
        peer = next(p for p in PEERS if p.name == self.name)
        return peer_python(peer, lambda s: print(s, file=sys.stderr))

    def argv(self, python: Path, url: str) -> list[str]:
        return [str(python), *(a.replace("{url}", url) for a in self.worker_args)]

    def enqueue_argv(self, python: Path, url: str, tasks: int) -> list[str]:
        return [str(python), str(APPS_DIR / f"{self.app}.py"), "enqueue", url, str(tasks)]

    @property
    def app(self) -> str:
        return "ours_app" if self.name == "taskcustody" else f"{self.name}_app"


OURS = System(
    "taskcustody",
    "taskcustody worker (1 thread)",
    (
        "-c",
        "from taskcustody.cli import main; main()",
        "worker",
        "ours_app:handle",
        "--queue",
        "audit",
        "--redis-url",
        "{url}",
        "--workers",
        "1",
        "--block-timeout",
        "0.5",
        "--heartbeat-interval",
        "0.5",
        "--server-ttl",
        "2",
        "--sweep-interval",
        "1",
        "--log-level",
        "warning",
    ),
    "defaults, except the lease shortened: --server-ttl 2 (default 15), --heartbeat-interval 0.5, "
    "--sweep-interval 1, --block-timeout 0.5",
    recovery_seconds=10.0,
    stall_seconds=5.0,
    stall_reason="longer than --server-ttl 2 s: a live server's sweep takes the task back",
)

RQ = System(
    "rq",
    "RQ default Worker (fork per job)",
    (
        "-c",
        "from rq.cli import main; main()",
        "worker",
        "--url",
        "{url}",
        "--maintenance-interval",
        "2",
        "--job-monitoring-interval",
        "1",
        "--worker-ttl",
        "3",
        "--logging_level",
        "ERROR",
        "audit",
    ),
    "default Worker (a work horse forked per job); jobs enqueued with Retry(max=3) and "
    "job_timeout=5; --maintenance-interval 2 (default 600), --job-monitoring-interval 1, "
    "--worker-ttl 3. A dead worker's job is retried once its StartedJobRegistry entry expires "
    "(heartbeat TTL: job_monitoring_interval + 60 s, the 60 s fixed in RQ), and a job stranded in "
    "the intermediate queue one minute (fixed) after a maintenance pass first saw it: hence 150 s",
    recovery_seconds=150.0,
    stall_seconds=70.0,
    stall_reason="longer than the 61 s heartbeat TTL after which a job counts as abandoned",
)

CELERY = System(
    "celery",
    "Celery prefork (1 child), acks_late",
    (
        "-m",
        "celery",
        "-A",
        "celery_app",
        "worker",
        "-P",
        "prefork",
        "-c",
        "1",
        "-Q",
        "audit",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "ERROR",
    ),
    "task_acks_late, task_reject_on_worker_lost, worker_prefetch_multiplier=1; Redis transport "
    "visibility_timeout=5 s (default 1 h), unacked_restore_interval=1, "
    "unacked_restore_throttle=1",
    recovery_seconds=20.0,
    stall_seconds=8.0,
    stall_reason="longer than visibility_timeout 5 s",
    unsafe="task_reject_on_worker_lost: Celery's docs warn it can make a task run in a loop",
)

DRAMATIQ = System(
    "dramatiq",
    "dramatiq Redis broker (1 process, 1 thread)",
    ("-m", "dramatiq", "dramatiq_app", "--processes", "1", "--threads", "1"),
    "RedisBroker(heartbeat_timeout=3000 ms (default 60 s), maintenance_chance=1e6 per 1e6 "
    "(default 1,000)); actor max_retries=3",
    recovery_seconds=15.0,
    stall_seconds=6.0,
    stall_reason="longer than heartbeat_timeout 3 s",
)

SAQ = System(
    "saq",
    "saq (1 worker, concurrency 1)",
    ("-m", "saq", "saq_app.settings"),
    "defaults, except jobs with retries=3 (default 1 = no second attempt) and timeout=5 s "
    "(default 10); sweep timer 1 s, but Queue.sweep holds a 60 s lock, so a stuck job waits up "
    "to 60 s + its 5 s timeout for a sweep: hence 90 s",
    recovery_seconds=90.0,
    stall_seconds=70.0,
    stall_reason="longer than the 60 s sweep lock plus the 5 s job timeout, so that another "
    "worker's sweep finds the job stuck",
)

ARQ = System(
    "arq",
    "arq (max_jobs 1)",
    ("-m", "arq", "arq_app.WorkerSettings"),
    "defaults (max_tries 5), except job_timeout=2 s (default 300), max_jobs=1: the in-progress "
    "key expires 12 s after the job started",
    recovery_seconds=25.0,
    stall_seconds=15.0,
    stall_reason="longer than the in-progress key's 12 s",
)

SYSTEMS = {s.name: s for s in (OURS, RQ, CELERY, DRAMATIQ, SAQ, ARQ)}
