"""`taskcustody worker MODULE:FUNCTION` with an `async def` handler runs it on the asyncio server
without being told (a real process, a real Redis): the handler is awaited (its return value is the
result, not a coroutine's repr), N workers serve concurrently (prefetching with --prefetch N), and
SIGTERM stops it cleanly."""

from __future__ import annotations

import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from taskcustody import Producer, QueueKeys, connect, get_result
from taskcustody.aio import is_async_handler
from tests.support.redis_server import RedisServerProcess
from tests.support.worker_command import (
    start_worker,
    worker_argv,
    worker_env,
    write_handler_module,
)

HANDLER = textwrap.dedent("""
    import asyncio

    async def handle(payload):
        await asyncio.sleep(0.01)
        return {"awaited": payload["n"] * 2}
""")


def test_is_async_handler_tells_async_def_from_def() -> None:
    async def a(payload: object) -> None: ...

    def s(payload: object) -> None: ...

    class Callable:
        async def __call__(self, payload: object) -> None: ...

    assert is_async_handler(a) and is_async_handler(Callable())
    assert not is_async_handler(s) and not is_async_handler(lambda p: p)


@pytest.mark.real_redis
@pytest.mark.parametrize("prefetch", [1, 4])
def test_the_worker_command_runs_an_async_def_handler_on_the_asyncio_server(
    real_redis: RedisServerProcess, tmp_path: Path, prefetch: int
) -> None:
    write_handler_module(tmp_path, "asynctasks:handle", HANDLER)
    client = connect(real_redis.url)
    client.flushall()
    keys = QueueKeys("cli-async")
    ids = [Producer(client, keys).enqueue({"n": n}) for n in range(20)]
    proc = start_worker(
        tmp_path,
        "asynctasks:handle",
        "cli-async",
        real_redis.url,
        "--workers",
        "4",
        "--block-timeout",
        "0.2",
        "--prefetch",
        str(prefetch),
    )
    try:
        results = [get_result(client, keys, task_id, timeout=30) for task_id in ids]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert results == [{"awaited": n * 2} for n in range(20)]
    assert proc.returncode == 0, stderr
    assert f"4 worker(s), prefetch {prefetch}" in stderr
    assert client.zcard(keys.servers) == 0  # deregistered on SIGTERM


@pytest.mark.real_redis
def test_an_async_handler_with_what_the_asyncio_api_does_not_serve_is_one_line_exit_1(
    real_redis: RedisServerProcess, tmp_path: Path
) -> None:
    write_handler_module(tmp_path, "asynctasks:handle", HANDLER)
    result = subprocess.run(
        worker_argv("asynctasks:handle", "cli-async", real_redis.url, "--min-replicas", "1"),
        cwd=tmp_path,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: an async def handler: min_replicas is not supported by the asyncio API yet: "
        "use the threaded API (taskcustody.Server) for WAIT after writes"
    ]
