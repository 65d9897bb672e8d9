"""`taskcustody verify` on fakeredis and on a real server agree on what they can catch
(verify/backends.py): the same seeded run catches the same broken designs on both; what
only a real server shows is caught only there, and a fakeredis run's report says so, with how to
cover it (`--embedded-redis`, `--redis-url`)."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.retry import Retry

import taskcustody.deploy.connection
from taskcustody.cli.app import main
from taskcustody.core.worker import Worker
from taskcustody.verify.backends import REAL_SERVER_ONLY
from taskcustody.verify.designs import BY_NAME
from taskcustody.verify.embedded import SERVER_BINARY_VARIABLE, redis_server_binary
from taskcustody.verify.report import BLIND_SPOTS_TITLE, text_report
from taskcustody.verify.report_html import html_report
from taskcustody.verify.run import Options, Result, verify
from tests.support.redis_server import RedisServerProcess

ROOT = Path(__file__).resolve().parent.parent
#: small and seeded: the same examples on both backends, every run
EXAMPLES = 20


#: the retrying client's run: the seeded real-server run catches it within 10 examples
RETRY_EXAMPLES = 10


def _run(
    url: str | None, variant: str = "correct", examples: int = EXAMPLES, refusals: bool = True
) -> Result:
    return verify(
        Options(
            examples=examples,
            steps=40,
            variant=variant,
            redis_url=url,
            model_check=False,
            shrink=False,
            embedded=url is not None,
            refusals=refusals,
            fault_coverage=False,
            loops=False,
        )
    )


@pytest.fixture
def server(real_redis: RedisServerProcess) -> Iterator[RedisServerProcess]:
    redis.Redis.from_url(real_redis.url).flushall()
    yield real_redis


# -- the same designs caught on both ----------------------------------------------------------


@pytest.mark.parametrize("design", ["blpop-take", "no-release"])
def test_a_broken_design_is_caught_on_fakeredis_and_on_a_real_server(
    server: RedisServerProcess, design: str
) -> None:
    pinned = BY_NAME[design].stateful
    assert pinned is not None and pinned.examples <= EXAMPLES
    kinds = {}
    for where, url in (("fakeredis", None), ("real", server.url)):
        result = _run(url, design)
        assert result.failure is not None, f"{design} not caught on {where}"
        kinds[where] = result.failure.kind
    # the same family: a kind the design's stateful run is pinned to fail with, on both
    assert set(kinds.values()) <= set(pinned.kinds), kinds


def test_a_wrong_blmove_is_caught_on_fakeredis_and_on_a_real_server(
    server: RedisServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Production takes with BLMOVE; the run drives it on fakeredis too (not the BRPOPLPUSH
    workaround, see backends.py), so a BLMOVE from the wrong end is caught on both."""
    original = Worker._take_args

    def wrong_end(self: Worker, block: float) -> tuple[Any, ...]:
        args = original(self, block)
        assert args[0] == "BLMOVE"
        return (*args[:3], "LEFT", "LEFT", block)

    monkeypatch.setattr(Worker, "_take_args", wrong_end)
    for url in (None, server.url):
        caught = _run(url).failure
        assert caught is not None and caught.kind == "conformance", (url, caught)


# -- what only a real server shows -------------------------------------------------------------


@pytest.mark.skipif(
    int(redis.__version__.split(".")[0]) < 6,
    reason="redis-py 5.0 does not send the command again with this Retry after an injected "
    "drop (the .ci/matrix cell Python 3.10 + redis-py 5.0.8: the real run passed)",
)
def test_transport_retries_are_caught_on_a_real_server_only(
    server: RedisServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends a command again after a broken connection (what redis-py does by
    default): in the stateful part, fakeredis ignores the retry, a real server runs the command
    twice. (Without the refusal attempts: the draws compared are the stateful part's. The
    production-loops part is left out (`loops=False`): its drops, injected as the loop sends,
    can make fakeredis run a retried take too; backends.py says so.)"""
    monkeypatch.setattr(taskcustody.deploy.connection, "no_retry", lambda: Retry(NoBackoff(), 3))
    # The same first examples on both: the real server's run fails within them.
    assert _run(None, examples=RETRY_EXAMPLES, refusals=False).failure is None
    caught = _run(server.url, examples=RETRY_EXAMPLES, refusals=False).failure
    # A command sent twice: a take or a drain that runs twice (the state differs from the
    # model's), or a claim that runs twice and then refuses the id to its own process; or a
    # command whose injected drop the retry hid (its reply read on the second try: the harness
    # says the dropped reply did not surface).
    assert caught is not None, "the real server's run caught no retried command"
    assert caught.kind in ("conformance", "ServerIdHeld") or (
        caught.kind == "fault" and "did not surface" in caught.message
    ), caught


def test_every_real_server_only_class_names_tests_that_exist() -> None:
    for row in REAL_SERVER_ONLY:
        assert row.tests, row.name
        for test in row.tests:
            path, _, name = test.partition("::")
            source = (ROOT / path).read_text()
            assert re.search(rf"^def {re.escape(name)}\(", source, re.M), test


def test_the_classes_the_stateful_run_reaches_are_tested_here() -> None:
    """A row that says the run catches it on a real server names a test of this file."""
    for row in REAL_SERVER_ONLY:
        if row.in_verify:
            assert any(t.startswith("tests/test_verify_backends_agree.py::") for t in row.tests)


# -- the report of a fakeredis run says what it cannot see -------------------------------------


@pytest.fixture(scope="module")
def fake_run() -> Result:
    return verify(Options(examples=2, steps=5, model_check=False, fault_coverage=False))


def _executable(tmp_path: Path) -> str:
    path = tmp_path / "redis-server"
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_fakeredis_report_lists_what_it_cannot_see_and_suggests_embedded_redis(
    fake_run: Result, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SERVER_BINARY_VARIABLE, _executable(tmp_path))
    text = text_report(fake_run)
    section = text.split(BLIND_SPOTS_TITLE + ":")[1].split("\n\n")[0]
    # two groups, each a heading and one line per class
    assert len(section.strip().splitlines()) == len(REAL_SERVER_ONLY) + 2
    assert "sends a command again" in section and "maxmemory" in section
    assert "--embedded-redis" in section and "--redis-url" in section
    page = html_report(fake_run)
    assert '<section id="blind-spots">' in page and "rerun with --embedded-redis" in page


def test_without_a_server_binary_the_report_points_to_redis_url(
    fake_run: Result, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SERVER_BINARY_VARIABLE, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    section = text_report(fake_run).split(BLIND_SPOTS_TITLE + ":")[1]
    assert "rerun with --redis-url URL" in section and "install redis-server" in section


def test_a_real_server_report_has_no_such_section(server: RedisServerProcess) -> None:
    result = verify(
        Options(examples=2, steps=5, model_check=False, redis_url=server.url, fault_coverage=False)
    )
    assert BLIND_SPOTS_TITLE not in text_report(result)
    assert "blind-spots" not in html_report(result)


# -- --embedded-redis ---------------------------------------------------------------------------


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["verify", "--quiet", "--no-model-check", "--no-fault-coverage", *args]
    )
    return result.exit_code, result.output


def _embedded(*args: str) -> tuple[int, str]:
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    return _cli("--embedded-redis", *args)


@pytest.mark.real_redis
def test_embedded_redis_runs_on_a_throwaway_server_and_stops_it() -> None:
    code, out = _embedded("--examples", "3", "--steps", "8")
    assert code == 0, out
    assert "backend:       redis-server" in out and "(embedded: a throwaway server at" in out
    assert BLIND_SPOTS_TITLE not in out
    url = re.search(r"throwaway server at (redis://\S+),", out)
    assert url is not None
    with pytest.raises(redis.ConnectionError):  # stopped at the end
        redis.Redis.from_url(url[1], socket_connect_timeout=1).ping()


@pytest.mark.real_redis
def test_a_failing_embedded_run_reproduces_with_embedded_redis() -> None:
    code, out = _embedded("--examples", "20", "--variant", "blpop-take")
    assert code == 1, out
    reproduce = out.split("reproduce:")[1].splitlines()[0]
    assert "--embedded-redis" in reproduce and "--redis-url" not in reproduce


def test_embedded_redis_without_a_binary_says_so_in_one_line_and_exits_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SERVER_BINARY_VARIABLE, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    code, out = _cli("--embedded-redis")
    assert code == 2, out
    assert out.strip().splitlines() == [
        "Error: --embedded-redis: no redis-server on PATH and no $TASKCUSTODY_REDIS_SERVER: "
        "install Redis, or run on your own Redis with --redis-url URL"
    ]


def test_embedded_redis_with_a_binary_that_is_not_one_exits_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SERVER_BINARY_VARIABLE, os.fspath(tmp_path / "missing"))
    code, out = _cli("--embedded-redis")
    assert code == 2, out
    assert "is not an executable file" in out and len(out.strip().splitlines()) == 1


def test_embedded_redis_and_redis_url_together_is_a_usage_error() -> None:
    code, out = _cli("--embedded-redis", "--redis-url", "redis://127.0.0.1:1/0")
    assert code == 2 and "pick one server" in out, out
