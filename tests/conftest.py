"""Backends for every custody test: fakeredis (the embedded default) and a real redis-server.

`backend` is parametrised over both. The real server is a throwaway one this session starts on a
free port and stops by pid; each test gets it flushed.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, settings

from taskcustody import QueueKeys, Settings, connect, connect_fake
from tests.support.redis_cluster import LocalCluster, throwaway_cluster
from tests.support.redis_server import (
    RedisServerProcess,
    redis_server_binary,
    throwaway_redis_server,
)

# Profiles: "dev" (default), "ci" (Hypothesis loads it itself when CI is set), "mutation" (mutmut
# runs: deterministic, no shrinking), "deep" (long runs).
settings.register_profile("dev", deadline=None, max_examples=50,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, derandomize=True, database=None,
                          print_blob=True, max_examples=50,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("mutation", deadline=None, derandomize=True, database=None,
                          max_examples=30, phases=["explicit", "generate"],  # type: ignore[list-item]
                          suppress_health_check=list(HealthCheck))
settings.register_profile("deep", deadline=None, max_examples=2_000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# Fast, deterministic timeouts for tests: a take on an empty queue returns after 50 ms.
#: retry_backoff=0: a failed attempt is retried at once, as the tests written before retry
#: delays expect (tests/test_retry_delays.py sets its own backoff).
TEST_SETTINGS = Settings(block_timeout=0.05, socket_timeout_margin=2.0, heartbeat_interval=5,
                         server_ttl=15, sweep_interval=10, max_attempts=3, drain_chunk=3,
                         track_commits=True, retry_backoff=0)


# A mutant can make a test block forever on a reply that never comes (a miscounted pipeline on
# fakeredis, which has no socket timeout). mutmut's own limit is CPU time, which a blocked test
# never uses, so the gate sets this wall-clock limit for its runs: the test fails instead of
# hanging the sweep (mutation/mutmut_gate.py).
TEST_TIMEOUT = float(os.environ.get("TASKCUSTODY_TEST_TIMEOUT", "0"))


class TestTimedOut(BaseException):
    """A BaseException, so that code under test catching Exception cannot swallow it."""


@pytest.fixture(autouse=True)
def _wall_clock_limit() -> Iterator[None]:
    if not TEST_TIMEOUT or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TestTimedOut(f"test ran past TASKCUSTODY_TEST_TIMEOUT={TEST_TIMEOUT:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Backend:
    name: str
    url: str | None  # None: fakeredis
    fake_server: fakeredis.FakeServer | None = None

    def client(self, settings: Settings = TEST_SETTINGS) -> redis.Redis:
        if self.url is None:
            return connect_fake(self.fake_server)
        return connect(self.url, settings)

    @property
    def real(self) -> bool:
        return self.url is not None


@pytest.fixture(scope="session")
def real_redis() -> Iterator[RedisServerProcess]:
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    with throwaway_redis_server() as server:
        yield server


def cluster_binaries_present() -> bool:
    import shutil

    return redis_server_binary() is not None and shutil.which("redis-cli") is not None


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """3 masters and 3 replicas on free ports, for the whole session (tests marked `cluster`
    leave the cluster as they found it: every master serving slots, `cluster_state:ok`). In CI
    (CI=true) a missing binary is a failure, not a skip."""
    if not cluster_binaries_present():
        if os.environ.get("CI"):
            pytest.fail("CI: redis-server and redis-cli are needed for the cluster tests")
        pytest.skip("no redis-server/redis-cli binary")
    with throwaway_cluster() as cluster:
        yield cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that starts a real server `real_redis`, however it asks for one, so that
    `-m real_redis` selects the real-Redis half of the suite (what .ci/matrix runs against each
    server) and `-m "not real_redis"` the rest. A test asks through the `real_redis` fixture, or
    through `backend`, whose real param carries the mark itself."""
    for item in items:
        if "real_redis" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_redis)


@pytest.fixture(params=["fakeredis", pytest.param("real", marks=pytest.mark.real_redis)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "fakeredis":
        yield Backend("fakeredis", None, fakeredis.FakeServer())
        return
    server: RedisServerProcess = request.getfixturevalue("real_redis")
    b = Backend("real", server.url)
    b.client().flushall()
    yield b


@pytest.fixture
def keys() -> QueueKeys:
    return QueueKeys("tq", prefix="test")
