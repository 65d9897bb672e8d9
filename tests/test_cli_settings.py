"""The worker's settings at the command line: a value Settings refuses is a usage error (exit 2,
one `Error:` line, no traceback) that names the flags the user typed, not the Settings fields, and
it is refused before anything is asked of Redis."""

from __future__ import annotations

from typing import Any

import click
import pytest
import redis
from click.testing import CliRunner, Result

from taskcustody import Producer, QueueKeys, Settings, SettingsError
from taskcustody.cli import app as cli_module
from taskcustody.cli.app import main
from tests.support.redis_server import RedisServerProcess, free_port

WORKER = ["worker", "json:dumps", "--queue", "cliq"]


def invoke(args: list[str], url: str | None = None) -> Result:
    url = url or f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: nothing may be asked
    return CliRunner().invoke(main, [*args, "--redis-url", url])


def error_line(result: Result) -> str:
    __tracebackhide__ = True
    assert "Traceback" not in result.output, result.output
    assert isinstance(result.exception, SystemExit), (result.exception, result.output)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--server-ttl", "5", "--heartbeat-interval", "5"],
            "Error: --server-ttl must exceed --heartbeat-interval",
        ),
        (["--block-timeout", "1e9"], "Error: --block-timeout must be at most 2147483 s"),
        (
            ["--block-timeout", "100", "--registry-grace", "50"],
            "Error: --registry-grace must exceed --block-timeout + socket_timeout_margin=3.0: ",
        ),
        (
            ["--block-timeout", "2147481"],
            "Error: --block-timeout + socket_timeout_margin=3.0 (the socket timeout, 2147484 s) "
            "must be at most 2147483 s",
        ),
        (
            ["--result-ttl", "99999999999999999"],
            "Error: --result-ttl must be at most 1000000000000000 s",
        ),
        (
            ["--retry-backoff", "2", "--retry-backoff-max", "1"],
            "Error: --retry-backoff-max must be >= --retry-backoff",
        ),
        (["--prefetch", "1001"], "Error: --prefetch must be at most 1000"),
        (["--max-attempts", str(2**53 + 1)], "Error: --max-attempts must be at most 2**53"),
        (
            ["--min-replicas", "1", "--replica-timeout", "9"],
            "Error: --replica-timeout must be shorter than the socket timeout (--block-timeout + "
            "socket_timeout_margin=3.0 = 5 s)",
        ),
    ],
)
def test_a_refused_setting_names_the_flags_the_user_typed(args: list[str], line: str) -> None:
    assert error_line(invoke([*WORKER, *args])).startswith(line)


FLOAT_OPTIONS = [
    "--block-timeout",
    "--heartbeat-interval",
    "--server-ttl",
    "--sweep-interval",
    "--retry-backoff",
    "--retry-backoff-max",
    "--shutdown-grace",
    "--replica-timeout",
    "--registry-grace",
]


@pytest.mark.parametrize("flag", FLOAT_OPTIONS)
@pytest.mark.parametrize("value", ["nan", "inf", "1e999"])
def test_a_float_option_that_is_not_finite_is_a_usage_error_naming_it(
    flag: str, value: str
) -> None:
    line = error_line(invoke([*WORKER, flag, value]))
    assert line.startswith(f"Error: {flag} must be a finite number of seconds"), line


@pytest.mark.parametrize("value", ["nan", "inf", "3000000"])
def test_wait_for_id_must_be_a_finite_number_of_seconds(value: str) -> None:
    line = error_line(invoke([*WORKER, "--wait-for-id", value]))
    assert "--wait-for-id" in line and "is not a number of seconds in [0, 2147483]" in line


def worker_settings_fields() -> list[str]:
    """The Settings fields the worker command sets: the keyword arguments of its `_settings`
    call (the first Settings of a run, recorded)."""
    seen: list[dict[str, Any]] = []

    def record(**kwargs: Any) -> Any:
        seen.append(kwargs)
        raise SettingsError("recorded")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_module, "Settings", record)
        invoke(WORKER)
    assert len(seen) == 1
    return sorted(seen[0])


@pytest.mark.parametrize("command", ["worker", "enqueue"])
def test_every_settings_field_a_command_sets_is_rendered_as_its_real_option(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settings is given each option under the option's own name; a refusal naming every field
    given renders each as a flag the command really has, and none as a bare field name."""
    args = WORKER if command == "worker" else ["enqueue", "--queue", "cliq", "1"]
    given: list[str] = []

    def refuse_naming_all(**kwargs: Any) -> Any:
        given.extend(kwargs)
        raise SettingsError(" ".join("{" + field + "}" for field in kwargs))

    monkeypatch.setattr(cli_module, "Settings", refuse_naming_all)
    line = error_line(invoke(args))
    assert given, "the command built no Settings"
    options = main.commands[command].params
    flags = {
        param.name: max(param.opts, key=len) for param in options if isinstance(param, click.Option)
    }
    assert set(given) <= set(flags), set(given) - set(flags)
    assert line == "Error: " + " ".join(flags[field] for field in given)
    assert set(given) >= {"block_timeout", "result_ttl", "server_ttl"} or command == "enqueue"


def test_the_worker_sets_every_field_it_has_an_option_for() -> None:
    """The fields the worker command passes are exactly those it has an option of the same name
    for (a field passed under another name would be rendered as its field name)."""
    fields = worker_settings_fields()
    settings_fields = set(Settings.__dataclass_fields__)
    option_names = {p.name for p in main.commands["worker"].params}
    assert set(fields) == settings_fields & option_names


def test_a_refused_setting_leaves_the_queue_and_the_registry_untouched(
    real_redis: RedisServerProcess,
) -> None:
    """Bad input loses nothing: it is refused before the worker connects, claims or takes."""
    keys = QueueKeys("cliq")
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    task_id = Producer(client, keys).enqueue({"n": 1})
    before = {k: client.type(k) for k in client.keys("*")}
    line = error_line(invoke([*WORKER, "--result-ttl", "99999999999999999"], real_redis.url))
    assert "--result-ttl" in line
    assert {k: client.type(k) for k in client.keys("*")} == before
    assert client.llen(keys.queue) == 1 and task_id.encode() in client.lindex(keys.queue, 0)
    assert client.zcard(keys.servers) == 0


@pytest.mark.parametrize("value", ["nan", "inf", "1e999"])
def test_sweep_refuses_a_grace_that_is_not_a_finite_number_naming_the_flag(value: str) -> None:
    line = error_line(
        invoke(
            [
                "sweep",
                "--queue",
                "q",
                "--redis-url",
                "redis://127.0.0.1:1/0",
                "--registry-grace",
                value,
            ]
        )
    )
    assert line.startswith("Error: --registry-grace must be a finite number of seconds"), line


def test_sweep_refuses_a_grace_no_longer_than_a_take_naming_the_flag() -> None:
    line = error_line(
        invoke(
            [
                "sweep",
                "--queue",
                "q",
                "--redis-url",
                "redis://127.0.0.1:1/0",
                "--registry-grace",
                "1",
            ]
        )
    )
    assert line.startswith("Error: --registry-grace must exceed"), line


def test_worker_threads_are_bounded_naming_the_flag() -> None:
    line = error_line(invoke([*WORKER, "--workers", "100000"]))
    assert "--workers" in line and "1<=x<=1024" in line, line
