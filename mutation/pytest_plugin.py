"""A pytest plugin for the named-mutant runs (`-p mutation.pytest_plugin`).

- `--mutation-report PATH`: write the node ids of every failed test (setup, call or teardown) and
  of every collection error, in the order they happened, as JSON.
- `--mutation-test-timeout SECONDS`: fail a test whose setup, call or teardown runs longer
  (SIGALRM in the main thread), so a mutant that makes a test hang (a drain that never ends, a
  fixture that joins a thread the mutant never ends) is reported as caught by that test, in that
  phase, instead of hanging the gate. `--mutation-limits PATH` raises the limit per test (the gate
  derives it from the test's duration on the unmutated copy: the model's deep searches are slow).
- `--mutation-first NODEID` (repeatable): run these tests before the rest, in the order given.
  The gate passes the tests that caught the mutant in its last recorded run
  (mutation/killers.json), so that with -x a mutant ends at its killer without the tests before
  it; a killer that no longer catches it only costs its own run, then the suite goes on as usual.

The timeout is raised only inside a phase (see `_Alarm`), never in pytest's own code between
phases: a raise there ends the whole run as pytest's INTERNALERROR (exit 3) with no test named,
which the gate counts as an ERROR, not a kill. tests/test_mutation_pytest_plugin.py pins both.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

_failures: list[dict[str, str]] = []
_durations: dict[str, float] = {}
HARD_GRACE = 15.0
_limits: dict[str, float] | None = None


class MutantTimeout(BaseException):
    """The test ran past the per-test limit of a mutation run. A BaseException, so that code
    catching Exception (a supervisor restarting its worker) cannot swallow it."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mutation")
    group.addoption("--mutation-report", default=None, help="write failed test ids as JSON here")
    group.addoption(
        "--mutation-test-timeout",
        type=float,
        default=0.0,
        help="fail any test running longer than this many seconds (0: no limit)",
    )
    group.addoption(
        "--mutation-limits",
        default=None,
        help="JSON {node id: seconds}: per-test limits that override the timeout",
    )
    group.addoption(
        "--mutation-first",
        action="append",
        default=[],
        metavar="NODEID",
        help="run this test before the others (repeatable, in the order given)",
    )


def _first_line(report: Any) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", ""):
        return str(crash.message).strip().splitlines()[0][:200]
    text = str(report.longreprtext or "").strip().splitlines()
    for line in text:
        if line.startswith("E "):
            return line[1:].strip()[:200]
    return text[-1][:200] if text else ""


def _write(config: pytest.Config, exitstatus: int) -> None:
    path = config.getoption("--mutation-report")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(
                {"exitstatus": int(exitstatus), "failures": _failures, "durations": _durations},
                f,
                indent=1,
            )


def _order(item: pytest.Item) -> int:
    """Fast implementation tests first, the stateful run next, the model's own tests last (they
    import only the model, which no named mutant touches). With -x, a mutant ends at the first
    test that catches it; a survivor still runs the whole suite."""
    path = item.nodeid
    if path.startswith("tests/model/"):
        return 2
    if path.startswith("tests/stateful/"):
        return 1
    return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--mutation-report"):
        first = {nodeid: i for i, nodeid in enumerate(config.getoption("--mutation-first"))}
        # stable: the suite's order within each group
        items.sort(key=lambda item: (first.get(item.nodeid, len(first)), _order(item)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.failed:
        _failures.append(
            {"test": report.nodeid, "when": report.when, "message": _first_line(report)}
        )


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _failures.append(
            {
                "test": report.nodeid or "<collection>",
                "when": "collect",
                "message": _first_line(report),
            }
        )


_LIMIT = pytest.StashKey[float]()


def _limit_of(item: pytest.Item) -> float:
    """The test's soft limit in seconds (0: none): --mutation-test-timeout, raised per test by
    --mutation-limits."""
    limit = float(item.config.getoption("--mutation-test-timeout") or 0.0)
    limits_path = item.config.getoption("--mutation-limits")
    if limits_path:
        global _limits
        if _limits is None:
            with open(limits_path, encoding="utf-8") as f:
                _limits = json.load(f)
        limit = max(limit, float(_limits.get(item.nodeid, 0.0)))
    return limit


class _Alarm:
    """The soft limit: SIGALRM in the main thread, whose handler raises MutantTimeout only while a
    test phase's own code runs (`phase` is set). A phase is what pytest calls inside
    `CallInfo.from_call`, where any exception, a BaseException included, becomes that phase's
    failure report. Outside a phase (pytest's reports, its terminal output, other plugins'
    hooks between the phases) the handler returns: an exception raised there escapes pytest's
    runner and ends the whole run as an INTERNALERROR (exit 3), with no test named.

    Past its limit the timer keeps firing every REPEAT seconds until the phase ends: a timeout
    raised where the code under test catches BaseException is raised again. The hang of
    `unbounded-drain` runs in fakeredis's Lua, whose `pcall(cjson.decode, raw)` in the drain
    script catches whatever its Python callback raises: a one-shot alarm landing there was
    sometimes lost, and only the watchdog's
    hard limit, 15 s later, ended the run."""

    REPEAT = 1.0

    def __init__(self) -> None:
        self.phase: tuple[str, float] | None = None  # (when, limit) of the phase running
        self.previous: Any = None
        self.installed = False

    def expire(self, signum: int, frame: FrameType | None) -> None:
        phase = self.phase
        if phase is None:
            return  # pytest's own code between phases (a tick pending at the disarm): not here
        when, limit = phase
        what = "test" if when == "call" else f"test {when}"
        raise MutantTimeout(f"{what} ran longer than {limit:g} s under this mutant (a hang)")

    def arm(self, when: str, limit: float) -> None:
        if not self.installed:
            # Installed once for the session: putting the default disposition back after each
            # phase would let a tick still pending at the disarm kill the process (SIGALRM).
            self.previous = signal.signal(signal.SIGALRM, self.expire)
            self.installed = True
        self.phase = (when, limit)
        signal.setitimer(signal.ITIMER_REAL, limit, self.REPEAT)

    def disarm(self) -> None:
        self.phase = None  # first: from here on a tick raises nothing
        signal.setitimer(signal.ITIMER_REAL, 0)

    def uninstall(self) -> None:
        if self.installed:
            self.disarm()
            signal.signal(signal.SIGALRM, self.previous)
            self.installed = False


_alarm = _Alarm()


def _watchdog(config: pytest.Config, test: str, when: str, seconds: float) -> threading.Event:
    """The hard limit: code stuck where the soft limit's exception cannot end it (a lock nobody
    will release, a C call that ignores signals), or where it must not be raised (the session's
    teardown), is recorded as what caught the mutant, and the run ends. Set the returned event
    when that code is done."""
    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        _failures.append(
            {"test": test, "when": when, "message": f"hung past {seconds:g} s; run ended"}
        )
        _write(config, 1)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(1)

    threading.Thread(target=watch, name="mutation-watchdog", daemon=True).start()
    return done


def _limited(item: pytest.Item, when: str) -> Iterator[None]:
    """One phase (setup, call or teardown) under the soft and the hard limit, each phase with the
    test's whole limit: a fixture whose teardown joins a thread the mutant never ends fails its
    teardown like a test that hangs fails its call."""
    limit = item.stash.get(_LIMIT, 0.0)
    if limit <= 0:
        yield
        return
    done = _watchdog(item.config, item.nodeid, when, limit + HARD_GRACE)
    _alarm.arm(when, limit)
    try:
        yield
    finally:
        # A tick can land here, the phase's code returned and its limit just passed: it raises
        # in this `finally`, and a disarm skipped would leave the timer firing, with the phase
        # still set, into pytest's own code (INTERNALERROR). Drop such a tick and disarm again.
        while True:
            try:
                _alarm.disarm()
                break
            except MutantTimeout:
                continue
        done.set()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    item.stash[_LIMIT] = _limit_of(item)


# Innermost among the phase's wrappers (trylast): the limit covers the fixtures and the test, not
# pytest's own capture and logging wrappers around them, whose state a timeout must not cut.
@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _limited(item, "setup")


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _limited(item, "call")


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield from _limited(item, "teardown")


def pytest_unconfigure(config: pytest.Config) -> None:
    _alarm.uninstall()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """Around pytest's teardown of the session's and modules' fixtures left after the last test
    (after -x, all of them): no soft limit there (a raise would end the run in a traceback), the
    hard one, as for a phase, with --mutation-test-timeout."""
    limit = float(session.config.getoption("--mutation-test-timeout") or 0.0)
    done = (
        _watchdog(session.config, "<session teardown>", "teardown", limit + HARD_GRACE)
        if limit > 0
        else None
    )
    try:
        yield
    finally:
        if done is not None:
            done.set()
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller, which saw every report, writes it
    _write(session.config, exitstatus)
