"""A pytest plugin for the named-mutant runs (`-p mutation.pytest_plugin`).

- `--mutation-report PATH`: write the node ids of every failed test (setup, call or teardown) and
  of every collection error, in the order they happened, as JSON.
- `--mutation-test-timeout SECONDS`: fail a test that runs longer (SIGALRM in the main thread), so a
  mutant that makes a test hang (a drain that never ends) is reported as caught by that test
  instead of hanging the gate. `--mutation-limits PATH` raises the limit per test (the gate
  derives it from the test's duration on the unmutated copy: the model's deep searches are slow).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
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
    group.addoption("--mutation-test-timeout", type=float, default=0.0,
                    help="fail any test running longer than this many seconds (0: no limit)")
    group.addoption("--mutation-limits", default=None,
                    help="JSON {node id: seconds}: per-test limits that override the timeout")


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
            json.dump({"exitstatus": int(exitstatus), "failures": _failures,
                       "durations": _durations}, f, indent=1)


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
        items.sort(key=_order)  # stable: the suite's order within each group


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.failed:
        _failures.append({"test": report.nodeid, "when": report.when,
                          "message": _first_line(report)})


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _failures.append({"test": report.nodeid or "<collection>", "when": "collect",
                          "message": _first_line(report)})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    limit = float(item.config.getoption("--mutation-test-timeout") or 0.0)
    limits_path = item.config.getoption("--mutation-limits")
    if limits_path:
        global _limits
        if _limits is None:
            with open(limits_path, encoding="utf-8") as f:
                _limits = json.load(f)
        limit = max(limit, float(_limits.get(item.nodeid, 0.0)))
    if limit <= 0:
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise MutantTimeout(f"test ran longer than {limit:g} s under this mutant (a hang)")

    # The soft limit raises in the main thread. A test stuck where that exception cannot end it
    # (a lock nobody will release) meets the hard limit: a watchdog thread records the test as
    # the one that caught the mutant, and ends the run.
    done = threading.Event()

    def watchdog() -> None:
        if done.wait(limit + HARD_GRACE):
            return
        _failures.append({"test": item.nodeid, "when": "call",
                          "message": f"hung past {limit + HARD_GRACE:g} s; run ended"})
        _write(item.config, 1)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(1)

    threading.Thread(target=watchdog, name="mutation-watchdog", daemon=True).start()
    # The soft limit is armed around the call phase only (pytest_runtest_call below): an alarm
    # that fired in pytest's own reporting after the call, or in a teardown, ended the whole run
    # as an INTERNALERROR (exit 3) with no test to name, and the gate counted the mutant as an
    # error instead of a kill (seen once in three runs of unbounded-drain). Setup and teardown
    # stay under the watchdog's hard limit.
    item.stash[_LIMIT] = (limit, expire)
    try:
        yield
    finally:
        done.set()


_LIMIT = pytest.StashKey[tuple[float, Callable[[int, FrameType | None], None]]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    armed = item.stash.get(_LIMIT, None)
    if armed is None:
        yield
        return
    limit, expire = armed
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller, which saw every report, writes it
    _write(session.config, exitstatus)
