"""End to end with real processes on real Redis: a server with several workers is SIGKILLed
mid-run and restarted with the same id; every task commits exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from taskcustody import Producer, QueueKeys, connect
from tests.support.end_to_end import assert_every_task_committed_once
from tests.support.redis_server import RedisServerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.real_redis]

ROOT = Path(__file__).resolve().parent.parent
N = 2_000


def _start_server(url: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TASKCUSTODY_E2E_URL=url)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taskcustody.cli",
            "worker",
            "tests.e2e_handler:handle",
            "--queue",
            "e2e",
            "--redis-url",
            url,
            "--workers",
            "4",
            "--server-id",
            "e2e-1",
            "--heartbeat-interval",
            "0.2",
            "--server-ttl",
            "1",
            "--sweep-interval",
            "0.5",
            "--block-timeout",
            "0.2",
            "--wait-for-id",
            "10",
            "--track-commits",
        ],
        env=env,
        cwd=ROOT,
    )


def test_sigkill_mid_run_and_restart_commits_every_task_exactly_once(
    real_redis: RedisServerProcess,
) -> None:
    url = real_redis.url
    admin = redis.Redis.from_url(url)
    admin.flushall()
    keys = QueueKeys("e2e")
    client = connect(url)
    ids = Producer(client, keys).enqueue_many([{"n": i} for i in range(N)])

    def committed() -> int:
        return int(admin.get(keys.committed) or 0)

    first = _start_server(url)
    try:
        wait_for(lambda: committed() >= N // 4, "the first process to commit a quarter")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    at_kill = committed()
    inflight_at_kill = sum(admin.llen(k) for k in admin.zrange(keys.inflight_registry, 0, -1))
    second = _start_server(url)
    try:
        wait_for(lambda: committed() >= N, "every task to commit")
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0
    finally:
        if second.poll() is None:
            second.kill()

    assert_every_task_committed_once(admin, keys, ids, "end-to-end", at_kill, inflight_at_kill)
