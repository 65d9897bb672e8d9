"""`taskcustody verify` never blames the protocol for the deployment: an error from set-up, the
network, a cluster redirect or a wrong-type key ends the run with exit 2 and that error, never
with a violation and a counterexample (a MovedError during set-up, hidden behind an
IndexError at teardown, was printed as "VIOLATION FOUND")."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from click.testing import CliRunner

from taskcustody.cli.app import main
from taskcustody.core.errors import WrongKeyType
from taskcustody.verify.deployment import deployment_error
from taskcustody.verify.faults import InjectedDrop
from taskcustody.verify.harness import Harness

SMALL = [
    "verify",
    "--no-model-check",
    "--examples",
    "3",
    "--steps",
    "5",
    "--quiet",
    "--shrink-seconds",
    "1",
]


def _invoke() -> tuple[int, str]:
    result = CliRunner().invoke(main, SMALL)
    return result.exit_code, result.output


def test_a_redirect_during_set_up_hidden_behind_a_teardown_error_exits_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def moved(self: Harness) -> None:
        raise redis.exceptions.MovedError("9450 127.0.0.1:7102")

    original_close = Harness.close

    def broken_close(self: Harness) -> None:
        original_close(self)
        raise IndexError("list index out of range")  # what set-up left half-done makes

    monkeypatch.setattr(Harness, "setup", moved)
    monkeypatch.setattr(Harness, "close", broken_close)
    code, out = _invoke()
    assert code == 2, out
    assert "MovedError" in out and "9450 127.0.0.1:7102" in out
    assert "VIOLATION" not in out and "counterexample" not in out.lower()


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("Error 111 connecting to 127.0.0.1:7101. Connection refused."),
        redis.TimeoutError("Timeout reading from socket"),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        WrongKeyType("key 'x' holds a string, but taskcustody needs a list there"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_deployment_error_in_a_step_exits_2(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    original = Harness.check
    calls = {"n": 0}

    def failing_check(self: Harness) -> None:
        calls["n"] += 1
        if calls["n"] > 2:  # after set-up and a step or two: in the middle of the run
            raise error
        original(self)

    monkeypatch.setattr(Harness, "check", failing_check)
    code, out = _invoke()
    assert code == 2, out
    assert type(error).__name__ in out
    assert "VIOLATION" not in out


def test_an_unreachable_redis_during_set_up_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(self: Harness, *args: Any, **kwargs: Any) -> None:
        raise redis.ConnectionError("Connection reset by peer")

    monkeypatch.setattr(Harness, "wipe", refused)
    code, out = _invoke()
    assert code == 2, out
    assert "Connection reset by peer" in out


class _Group(Exception):
    exceptions: tuple[BaseException, ...] = ()


def test_the_faults_verify_injects_itself_are_not_the_deployments() -> None:
    assert deployment_error(InjectedDrop("dropped on purpose")) is None
    hidden = IndexError("teardown")
    hidden.__context__ = redis.exceptions.MovedError("1 127.0.0.1:1")
    assert isinstance(deployment_error(hidden), redis.exceptions.MovedError)
    group = _Group("flaky")  # Hypothesis's FlakyFailure is an exception group
    group.exceptions = (ValueError("x"), redis.TimeoutError("t"))
    assert isinstance(deployment_error(group), redis.TimeoutError)


def test_a_violation_is_still_a_violation() -> None:
    result = CliRunner().invoke(
        main,
        [
            "verify",
            "--no-model-check",
            "--examples",
            "30",
            "--steps",
            "15",
            "--quiet",
            "--variant",
            "no-release",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "VIOLATION" in result.output


def test_the_node_url_of_a_cluster_run_keeps_the_seeds_credentials_and_scheme() -> None:
    from taskcustody.verify.run import _with_address

    assert (
        _with_address("rediss://u:pw@seed:7000/0?ssl_cert_reqs=none", "10.0.0.2", 7002)
        == "rediss://u:pw@10.0.0.2:7002/0?ssl_cert_reqs=none"
    )
    assert (
        _with_address("redis://127.0.0.1:7101/0", "127.0.0.1", 7102) == "redis://127.0.0.1:7102/0"
    )
