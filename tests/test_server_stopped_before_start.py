"""A server stopped before it started (SIGTERM, SIGINT or `stop` while it waits for its id to be
free) exits cleanly: its signal handlers are in place before it waits, so a SIGTERM is a graceful
stop (exit 0, one line), not the default action's death, and nothing is claimed or registered.

The race this pins: a supervisor restarts a crashed server with `--wait-for-id`, then stops it
while it still waits for the dead process's lease to lapse. The handlers used to be installed
only after `start`, so that SIGTERM killed the process (exit -15)."""

from __future__ import annotations

import signal
import textwrap
import threading
from pathlib import Path

import pytest
import redis

from taskcustody import QueueKeys, Server, Settings, connect
from tests.support.redis_server import RedisServerProcess
from tests.support.worker_command import start_worker, write_handler_module

HANDLERS = textwrap.dedent("""
    def handle(payload):
        return payload

    async def ahandle(payload):
        return payload
""")

WAITING = "is held by a live process: waiting up to"


def _hold_the_id(url: str, keys: QueueKeys, server_id: str) -> Server:
    """Claim `server_id` for a minute, as a live process would (no heartbeat needed)."""
    holder = Server(
        connect(url),
        keys,
        server_id,
        lambda p: p,
        settings=Settings(server_ttl=60, heartbeat_interval=1),
    )
    holder.claim()
    return holder


def _registrations(client: redis.Redis, keys: QueueKeys) -> tuple[object, ...]:
    """What a claim and a start write: the id's incarnation, the live servers, the lists."""
    return (
        client.hgetall(keys.incarnations),
        client.zrange(keys.servers, 0, -1, withscores=True),
        client.zrange(keys.inflight_registry, 0, -1, withscores=True),
    )


@pytest.mark.real_redis
@pytest.mark.parametrize("handler", ["stoptasks:handle", "stoptasks:ahandle"])
def test_sigterm_while_waiting_for_the_id_exits_0_and_claims_nothing(
    real_redis: RedisServerProcess, tmp_path: Path, handler: str
) -> None:
    write_handler_module(tmp_path, handler, HANDLERS)
    client = connect(real_redis.url)
    client.flushall()
    keys = QueueKeys("stop-before-start")
    _hold_the_id(real_redis.url, keys, "held")
    held = _registrations(client, keys)
    proc = start_worker(
        tmp_path,
        handler,
        "stop-before-start",
        real_redis.url,
        "--server-id",
        "held",
        "--wait-for-id",
        "600",
    )
    try:
        assert proc.stderr is not None
        seen: list[str] = []
        for line in proc.stderr:  # the conftest's wall-clock limit guards a hang
            seen.append(line)
            if WAITING in line:
                break
        assert any(WAITING in line for line in seen), "".join(seen)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(seen) + rest
    assert proc.returncode == 0, stderr
    assert "stopped while waiting for server id 'held' to be free" in stderr
    assert "Traceback" not in stderr
    # Nothing claimed, nothing registered: the holder's claim is as it was.
    assert _registrations(client, keys) == held


@pytest.mark.real_redis
def test_stop_while_waiting_for_the_id_returns_from_run(real_redis: RedisServerProcess) -> None:
    client = connect(real_redis.url)
    client.flushall()
    keys = QueueKeys("stop-before-start")
    _hold_the_id(real_redis.url, keys, "held")
    held = _registrations(client, keys)
    server = Server(client, keys, "held", lambda p: p, workers=1)
    waiting = threading.Event()
    claim = server.claim

    def claim_then_say() -> int:
        try:
            return claim()
        finally:
            waiting.set()

    server.claim = claim_then_say  # type: ignore[method-assign]
    runner = threading.Thread(target=server.run, kwargs={"wait_for_id": 600}, daemon=True)
    runner.start()
    assert waiting.wait(30)
    server.stop()
    runner.join(30)
    assert not runner.is_alive()
    assert _registrations(client, keys) == held
