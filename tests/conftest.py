"""Backends for every custody test: fakeredis (the embedded default) and a real redis-server.

`backend` is parametrised over both. The real server is a throwaway one this session starts on a
free port and stops by pid; each test gets it flushed.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

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
settings.register_profile(
    "dev", deadline=None, max_examples=50, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "mutation",
    deadline=None,
    derandomize=True,
    database=None,
    max_examples=30,
    phases=["explicit", "generate"],  # type: ignore[list-item]
    suppress_health_check=list(HealthCheck),
)
settings.register_profile(
    "deep", deadline=None, max_examples=2_000, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# Fast, deterministic timeouts for tests: a take on an empty queue returns after 50 ms.
#: retry_backoff=0: a failed attempt is retried at once, as the tests written before retry
#: delays expect (tests/test_retry_delays.py sets its own backoff).
TEST_SETTINGS = Settings(
    block_timeout=0.05,
    socket_timeout_margin=2.0,
    heartbeat_interval=5,
    server_ttl=15,
    sweep_interval=10,
    max_attempts=3,
    drain_chunk=3,
    track_commits=True,
    retry_backoff=0,
)


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


#: Test files that share one computation through a cache of their own (not a fixture): under
#: pytest-xdist they run on one worker, so that it is computed once.
SHARED_CACHES = {
    "tests/model/test_checker.py": "model-searches",  # tests/model/searches.py
    "tests/model/test_checker_figures.py": "model-searches",
}
TESTS = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def worker_groups() -> dict[str, str]:
    """{test file: group} for the files whose tests must run on one xdist worker.

    A file that builds a module-scoped fixture (a verify run, a pair of servers) keeps its tests
    together, so that the fixture is built once per run and not once per worker; the users of
    the session's Redis Cluster (`local_cluster`) run on one worker, so that one cluster starts;
    SHARED_CACHES as said there. Read from the files' text: the controller, which schedules,
    does not collect."""
    groups = dict(SHARED_CACHES)
    root = os.path.dirname(TESTS)
    for folder, _, names in os.walk(TESTS):
        for name in names:
            if not (name.startswith("test_") and name.endswith(".py")):
                continue
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if "local_cluster" in text:
                groups.setdefault(relative, "cluster")
            elif 'scope="module"' in text:
                groups.setdefault(relative, relative)
    return groups


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `-n` (pytest-xdist's default `--dist load`): every test is scheduled alone, for
    balance, except the groups of `worker_groups()`, each of which goes to one worker whole.
    (A scheduler of our own, not `xdist_group` marks: pytest 9.2 keeps a node's id where
    pytest-xdist 3.8's `--dist loadgroup` no longer renames it, so those marks do nothing.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return worker_groups().get(nodeid.split("::")[0], nodeid)

    return SharedFixtureScheduling(config, log)


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
