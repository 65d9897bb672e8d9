"""End to end with real processes on real Redis, asyncio side: an asyncio server of 8 concurrent
workers (an `async def` handler) is SIGKILLed mid-run beside a threaded server on the same queue,
and restarted with the same id; every task commits exactly once. Also with both servers
prefetching (`--prefetch 4`: the killed process holds whole batches)."""

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


def _start(
    url: str, handler: str, server_id: str, workers: int, prefetch: int = 1
) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, TASKCUSTODY_E2E_URL=url)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taskcustody.cli",
            "worker",
            handler,
            "--queue",
            "e2e",
            "--redis-url",
            url,
            "--workers",
            str(workers),
            "--server-id",
            server_id,
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
            "--prefetch",
            str(prefetch),
        ],
        env=env,
        cwd=ROOT,
    )


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("prefetch", [1, 4])
def test_sigkill_of_an_asyncio_server_beside_a_threaded_one_commits_every_task_once(
    real_redis: RedisServerProcess,
    prefetch: int,
) -> None:
    url = real_redis.url
    admin = redis.Redis.from_url(url)
    admin.flushall()
    keys = QueueKeys("e2e")
    ids = Producer(connect(url), keys).enqueue_many([{"n": i} for i in range(N)])

    def committed() -> int:
        return int(admin.get(keys.committed) or 0)

    threaded = _start(url, "tests.e2e_handler:handle", "e2e-threads", 2, prefetch)
    first = _start(url, "tests.e2e_async_handler:handle", "e2e-aio", 8, prefetch)
    try:
        wait_for(lambda: committed() >= N // 4, "a quarter of the tasks to commit")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        at_kill = committed()
        inflight_at_kill = sum(admin.llen(k) for k in admin.zrange(keys.inflight_registry, 0, -1))
        second = _start(url, "tests.e2e_async_handler:handle", "e2e-aio", 8, prefetch)
        try:
            wait_for(lambda: committed() >= N, "every task to commit")
            assert _stop(second) == 0
        finally:
            if second.poll() is None:
                second.kill()
        assert _stop(threaded) == 0
    finally:
        for proc in (first, threaded):
            if proc.poll() is None:
                proc.kill()

    assert_every_task_committed_once(
        admin, keys, ids, "asyncio end-to-end", at_kill, inflight_at_kill
    )
