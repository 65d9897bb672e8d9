"""The named-mutant runs' plugin (mutation/pytest_plugin.py).

Its order: the tests given by --mutation-first run before the others, and a run with -x still
goes on past one of them that passes (the gate's recorded killers are an order, not a selection).

Its per-test limit: a hang anywhere in a test,
its setup, its call or its teardown, ends as that phase's failure, named in the report, and the
alarm never raises in pytest's own code (that ended the run as an INTERNALERROR, exit 3, with no
test named, and the gate counted a killed mutant as an error).

Each test runs pytest on a small test file in a child process under the plugin with a short
limit. The hangs never end on their own (an Event nobody sets), so how the run ends depends on
the plugin alone, not on timing; the limit only sets how long each run takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 0.3
#: Only a bound on a run that never ends. Which limit ended a run is read from its report, not
#: from the clock: the soft limit's failure says MutantTimeout, the hard limit's (the limit + 15 s)
#: says "hung past" (`assert_timed_out`). A bound of 12 s, meant to tell the two apart by time,
#: failed runs that had only started slowly on a loaded 2-core machine (load 6: pytest's own
#: start-up took most of it).
RUN_TIMEOUT = 120.0


@dataclass
class Run:
    returncode: int
    failures: list[dict[str, str]]
    output: str


def run_plugin(
    tmp_path: Path, test_source: str, conftest: str = "", extra: Sequence[str] = ()
) -> Run:
    (tmp_path / "test_hang.py").write_text(test_source, encoding="utf-8")
    (tmp_path / "conftest.py").write_text(conftest, encoding="utf-8")
    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "mutation.pytest_plugin",
            "-p",
            "no:cacheprovider",
            f"--mutation-report={report}",
            f"--mutation-test-timeout={LIMIT:g}",
            "-q",
            "--rootdir",
            str(tmp_path),
            *extra,
            str(tmp_path / "test_hang.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    failures = json.loads(report.read_text(encoding="utf-8"))["failures"] if report.exists() else []
    return Run(proc.returncode, failures, proc.stdout + proc.stderr)


def assert_timed_out(run: Run, when: str) -> None:
    assert "INTERNALERROR" not in run.output, run.output
    assert run.returncode == 1, run.output
    assert [(f["test"], f["when"]) for f in run.failures] == [("test_hang.py::test_hangs", when)]
    assert "MutantTimeout" in run.failures[0]["message"], run.failures


def test_a_hang_in_the_call_fails_the_call(tmp_path: Path) -> None:
    run = run_plugin(
        tmp_path, "import threading\n\ndef test_hangs():\n    threading.Event().wait()\n"
    )
    assert_timed_out(run, "call")


def test_a_fixture_teardown_that_hangs_fails_the_teardown(tmp_path: Path) -> None:
    # A fixture that joins a thread the mutant never ends: the call passed, the teardown hangs.
    run = run_plugin(
        tmp_path,
        "import threading\nimport pytest\n\n"
        "@pytest.fixture\n"
        "def joined():\n"
        "    yield\n"
        "    threading.Event().wait()\n\n"
        "def test_hangs(joined):\n"
        "    pass\n",
    )
    assert_timed_out(run, "teardown")


def test_a_fixture_setup_that_hangs_fails_the_setup(tmp_path: Path) -> None:
    run = run_plugin(
        tmp_path,
        "import threading\nimport pytest\n\n"
        "@pytest.fixture\n"
        "def stuck():\n"
        "    threading.Event().wait()\n\n"
        "def test_hangs(stuck):\n"
        "    pass\n",
    )
    assert_timed_out(run, "setup")


def test_a_timeout_the_code_under_test_swallows_is_raised_again(tmp_path: Path) -> None:
    # What fakeredis's Lua does to unbounded-drain's hang: the drain script's
    # `pcall(cjson.decode, raw)` catches whatever its Python callback raises, the alarm included.
    run = run_plugin(
        tmp_path,
        "import threading\n\n"
        "def test_hangs():\n"
        "    try:\n"
        "        threading.Event().wait()\n"
        "    except BaseException:\n"
        "        pass\n"
        "    threading.Event().wait()\n",
    )
    assert_timed_out(run, "call")


# The alarm comes due during the call, but SIGALRM is blocked (in every thread: from before the
# plugin starts any), so the tick is still pending when the call ends; a hook of pytest's
# reporting, outside any phase, unblocks it: a tick that comes after the phase's code ended and
# before the timer was cancelled, made certain.
PENDING_TICK_TEST = """\
import threading

def test_hangs():
    threading.Event().wait(1.0)
"""

PENDING_TICK_CONFTEST = """\
import signal
import pytest

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    if call.when == "call":
        assert signal.SIGALRM in signal.sigpending()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
"""


def test_an_alarm_due_outside_a_phase_ends_no_run(tmp_path: Path) -> None:
    run = run_plugin(tmp_path, PENDING_TICK_TEST, PENDING_TICK_CONFTEST)
    assert "INTERNALERROR" not in run.output, run.output
    # The test itself finished inside its phase: it passes (the tick came after its call).
    assert run.returncode == 0, run.output
    assert run.failures == []


ORDERED = """\
import pytest

@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_fails_from_two(n):
    assert n < 2
"""
ORDERED_ID = "test_hang.py::test_fails_from_two"


def test_the_first_tests_run_before_the_others(tmp_path: Path) -> None:
    run = run_plugin(tmp_path, ORDERED, extra=["-x", f"--mutation-first={ORDERED_ID}[4]"])
    # -x: the run ends at its first failure, which is the test named first, not [2]
    assert [f["test"] for f in run.failures] == ["test_hang.py::test_fails_from_two[4]"]


def test_a_first_test_that_passes_lets_the_run_go_on(tmp_path: Path) -> None:
    run = run_plugin(
        tmp_path,
        ORDERED,
        extra=["-x", f"--mutation-first={ORDERED_ID}[1]", "--mutation-first=no_such.py::test"],
    )
    # a recorded killer that no longer fails: the suite's own order follows, up to [2]
    assert run.returncode == 1, run.output
    assert [f["test"] for f in run.failures] == ["test_hang.py::test_fails_from_two[2]"]
