"""Our clients never ask Redis for maintenance notifications (redis_options.py): a Redis 7 does
not know `CLIENT MAINT_NOTIFICATIONS`, and redis-py 8 logged its refusal on every connection
(two lines per worker under `taskcustody worker -v`). Checked on a real redis-server, where the
command would be refused; fakeredis is never asked."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redis.asyncio

from taskcustody import connect
from taskcustody.aio.connection import connect_async
from taskcustody.aio.connection import own_connection as own_async_connection
from taskcustody.deploy import redis_options
from taskcustody.deploy.cluster import own_connection
from taskcustody.deploy.connection import check_version
from taskcustody.verify.aio import async_client_like
from tests.support.redis_cluster import LocalCluster
from tests.support.redis_server import RedisServerProcess
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
REFUSED = "maintenance notifications"  # redis-py: "Failed to enable maintenance notifications"


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if REFUSED in r.getMessage() or "MAINT_NOTIFICATIONS" in r.getMessage()
    ]


def test_connect_asks_redis_7_for_no_maintenance_notifications(
    real_redis: RedisServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="redis")
    client = connect(real_redis.url)
    try:
        assert client.ping()
        check_version(client)  # INFO, on the pool's connection
        # A worker's own connection, outside the pool, built from the pool's arguments.
        conn = own_connection(client, "tc:{q}:queue")
        try:
            conn.send_command("PING")
            assert conn.read_response() == b"PONG"
        finally:
            conn.disconnect()
    finally:
        client.close()
    assert _refusals(caplog) == []


def test_connect_async_asks_redis_7_for_no_maintenance_notifications(
    real_redis: RedisServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="redis")

    async def talk() -> None:
        client = connect_async(real_redis.url)
        try:
            assert await client.ping()
            conn = own_async_connection(client)
            await conn.send_command("PING")
            assert await conn.read_response() == b"PONG"
            await conn.disconnect()
        finally:
            await client.aclose()
        # verify --async's asyncio client beside a threaded one (verify/aio.py)
        threaded = connect(real_redis.url)
        like = async_client_like(threaded)
        try:
            assert await like.ping()
        finally:
            await like.aclose()
            threaded.close()

    asyncio.run(talk())
    assert _refusals(caplog) == []


@pytest.mark.cluster
def test_a_cluster_client_asks_for_no_maintenance_notifications(
    local_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="redis")
    client = connect(local_cluster.url())
    try:
        client.set("tc:{maint}:probe", b"1")
        assert client.get("tc:{maint}:probe") == b"1"
        client.delete("tc:{maint}:probe")
    finally:
        client.close()
    assert _refusals(caplog) == []


def test_a_worker_with_v_prints_no_maintenance_notification_lines(
    real_redis: RedisServerProcess,
) -> None:
    admin = redis.Redis.from_url(real_redis.url, protocol=2)
    before = len(admin.client_list())
    workers = 4
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taskcustody.cli",
            "worker",
            "tests.e2e_handler:handle",
            "--queue",
            "maint-notifications",
            "--redis-url",
            real_redis.url,
            "--workers",
            str(workers),
            "--block-timeout",
            "0.2",
            "-v",
        ],
        env=dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        ),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Each worker has its connection of its own once it waits for a task; the server's
        # pool has one more.
        wait_for(
            lambda: len(admin.client_list()) >= before + workers + 1,
            "every worker to connect",
            limit=60,
        )
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        admin.close()
    assert proc.returncode == 0, err
    assert "DEBUG" in err or "INFO" in err, err  # -v logs
    assert "taskcustody.server INFO started" in err, err
    assert REFUSED not in err and "MAINT_NOTIFICATIONS" not in err, err


def test_without_the_option_in_redis_py_nothing_is_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    # redis-py 5.0 (the floor) has no maintenance notifications: no keyword for it, or its
    # clients would refuse an unknown one.
    monkeypatch.setattr(redis_options, "CONFIG_CLASS", None)
    assert redis_options.no_maint_notifications(redis.ConnectionPool) == {}


def test_a_client_class_without_the_option_is_passed_nothing() -> None:
    # A redis-py whose pools have the option but one of its clients not yet (the cluster and
    # asyncio clients came later): that client is passed nothing.
    class OldPool:
        def __init__(self, **connection_kwargs: object) -> None:
            pass

    assert redis_options.no_maint_notifications(OldPool) == {}
    if redis_options.CONFIG_CLASS is not None:
        for constructor in (redis.ConnectionPool, redis.asyncio.ConnectionPool):
            off = redis_options.no_maint_notifications(constructor)
            assert off[redis_options.OPTION].enabled is False
