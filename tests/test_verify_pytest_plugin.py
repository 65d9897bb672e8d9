"""The pytest plugin: `pytest --taskcustody-redis-url URL [--taskcustody-settings module:attr]` runs
the conformance suite against that Redis as test items; without the option it adds nothing.

Each run is a pytest of its own in a subprocess, in a throwaway project, with the plugin loaded by
`-p taskcustody_pytest` (what the pytest11 entry point names, which the test environment need not
have installed). The entry point has the module's own name, so that where it is installed (an
editable install, as in CI) pytest sees the `-p` plugin as already registered instead of refusing
it as a second registration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from taskcustody.cli.app import main
from tests.support.redis_server import RedisServerProcess

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "taskcustody_pytest"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project: one test of its own and a settings module."""
    (tmp_path / "test_theirs.py").write_text("def test_theirs():\n    pass\n")
    (tmp_path / "their_settings.py").write_text(
        "from taskcustody import Settings\n"
        "SETTINGS = Settings(prefetch=4)\n"
        "PLAIN = Settings()\n"
        "NOT_SETTINGS = 3\n"
    )
    return tmp_path


def pytest_in(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "model"), str(project)])
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            PLUGIN,
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            str(project),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=project,
        env=env,
    )


def test_the_entry_point_is_declared() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}


def test_loading_the_plugin_imports_nothing_of_taskcustody() -> None:
    """pytest loads it in every run: it must not import the package before a run has set its
    paths (the mutation gate tests a mutated copy), nor cost more than pytest itself."""
    code = (
        f"import sys, {PLUGIN}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('taskcustody', 'taskcustody_model', 'hypothesis', 'redis', 'fakeredis'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert result.returncode == 0, result.stderr


def test_without_the_option_the_plugin_adds_nothing(project: Path) -> None:
    result = pytest_in(project, "--collect-only")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_theirs.py::test_theirs" in result.stdout
    assert "taskcustody" not in result.stdout.replace("--taskcustody", "")
    assert "1 test collected" in result.stdout


def test_the_option_adds_the_conformance_run_against_that_redis(
    project: Path, real_redis: RedisServerProcess
) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    client.set("someone-else", "untouched")
    result = pytest_in(
        project,
        "--taskcustody-redis-url",
        real_redis.url,
        "--taskcustody-examples",
        "2",
        "--taskcustody-steps",
        "10",
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "PASSED taskcustody::stateful-conformance-on-redis" in out
    assert "PASSED test_theirs.py::test_theirs" in out
    assert "2 passed" in out
    assert "2 examples run (2 asked for)" in out  # the item's report section says what it covered
    assert client.keys("*") == [b"someone-else"]


def test_the_users_settings_bring_the_prefetching_workers_run(
    project: Path, real_redis: RedisServerProcess
) -> None:
    result = pytest_in(
        project,
        "--taskcustody-redis-url",
        real_redis.url,
        "--taskcustody-settings",
        "their_settings:SETTINGS",
        "--taskcustody-examples",
        "2",
        "--taskcustody-steps",
        "10",
        "-k",
        "taskcustody",
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "PASSED taskcustody::stateful-conformance-on-redis\n" in out
    assert "PASSED taskcustody::stateful-conformance-on-redis-with-the-prefetching-worker" in out
    assert "2 passed, 1 deselected" in out


def test_the_budget_stops_the_conformance_item_cleanly(
    project: Path, real_redis: RedisServerProcess
) -> None:
    """A budget far below one example's time: the item is skipped (spent before the run began)
    or passes having run a single example; either way it says so and exits 0."""
    result = pytest_in(
        project,
        "--taskcustody-redis-url",
        real_redis.url,
        "--taskcustody-examples",
        "50",
        "--taskcustody-max-seconds",
        "0.001",
        "-m",
        "taskcustody",
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert ("SKIPPED" in out and "(--taskcustody-max-seconds 0.001)" in out) or (
        "1 examples run (50 asked for)" in out and "PARTIAL" in out
    ), out


def test_a_queue_that_holds_keys_is_refused_and_left_alone(
    project: Path, real_redis: RedisServerProcess
) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    client.rpush("taskcustody-verify:{busy}:queue", "somebody's task")
    result = pytest_in(
        project,
        "--taskcustody-redis-url",
        real_redis.url,
        "--taskcustody-queue",
        "busy",
        "-k",
        "taskcustody",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "already holds 1 key(s)" in result.stdout
    assert "Traceback" not in result.stdout
    assert client.lrange("taskcustody-verify:{busy}:queue", 0, -1) == [b"somebody's task"]


def test_an_unreachable_redis_fails_the_item_in_one_line(project: Path) -> None:
    result = pytest_in(
        project, "--taskcustody-redis-url", "redis://127.0.0.1:1/0", "-m", "taskcustody"
    )
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "FAILED taskcustody::stateful-conformance-on-redis" in out
    assert "127.0.0.1:1" in out and "Traceback" not in out


def test_the_cli_refuses_a_queue_that_holds_keys_too(real_redis: RedisServerProcess) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    client.rpush("taskcustody-verify:{busy}:queue", "somebody's task")
    result = CliRunner().invoke(
        main,
        ["verify", "--redis-url", real_redis.url, "--queue", "busy", "--no-model-check", "--quiet"],
    )
    assert result.exit_code == 2, result.output
    assert "already holds 1 key(s)" in result.output
    assert client.lrange("taskcustody-verify:{busy}:queue", 0, -1) == [b"somebody's task"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--taskcustody-settings", "their_settings:NOT_SETTINGS"], "not a taskcustody Settings"),
        (["--taskcustody-max-seconds", "-1"], "> 0"),
    ],
)
def test_bad_options_are_a_usage_error_in_one_line(
    project: Path, args: list[str], said: str
) -> None:
    # A URL nothing listens on: the options are refused before anything connects.
    result = pytest_in(project, "--taskcustody-redis-url", "redis://127.0.0.1:1/0", *args)
    assert result.returncode == 4, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and said in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("spec", "said"),
    [  # (the loader of the plugin and of verify)
        ("their_settings:PLAIN", ""),
        ("their_settings:NOT_SETTINGS", "is a int, not a taskcustody Settings"),
        ("their_settings", "expected MODULE:ATTR"),
        ("their_settings:MISSING", "has no attribute 'MISSING'"),
        ("no_such_module_of_theirs:X", "cannot import 'no_such_module_of_theirs'"),
    ],
)
def test_settings_are_loaded_from_module_attr(
    project: Path, monkeypatch: pytest.MonkeyPatch, spec: str, said: str
) -> None:
    from taskcustody import Settings
    from taskcustody.verify.run import load_settings

    monkeypatch.syspath_prepend(str(project))
    if not said:
        assert load_settings(spec) == Settings()
        return
    with pytest.raises(ValueError, match=re.escape(said)):
        load_settings(spec)


def test_verify_takes_the_users_settings_and_repeats_them_in_its_command(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from taskcustody.verify.run import Options, run_settings

    monkeypatch.syspath_prepend(str(project))
    bad = CliRunner().invoke(main, ["verify", "--settings", "their_settings:NOT_SETTINGS"])
    assert bad.exit_code == 2 and "not a taskcustody Settings" in bad.output
    assert (
        "--settings their_settings:SETTINGS"
        in Options(settings_spec="their_settings:SETTINGS").command()
    )
    good = CliRunner().invoke(
        main,
        [
            "verify",
            "--settings",
            "their_settings:PLAIN",
            "--quiet",
            "--no-model-check",
            "--examples",
            "2",
            "--steps",
            "10",
            "--no-fault-coverage",
        ],
    )
    assert good.exit_code == 0, good.output
    from taskcustody import Settings

    mine = run_settings(
        Settings(socket_timeout_margin=7.0, heartbeat_interval=1.0, server_ttl=99.0)
    )
    assert mine.socket_timeout_margin == 7.0  # how it talks to Redis: the user's
    assert mine.server_ttl == run_settings(None).server_ttl  # the protocol's timing: the model's
