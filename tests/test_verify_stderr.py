"""`taskcustody verify`'s stderr is its progress: the protocol's own log lines (what the injected
faults make it log: "lost custody ... judged dead", "poison pill ... dead-lettered") are counted
in the report and printed only with -v; --quiet leaves stderr empty on a pass."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskcustody.cli.app import main
from taskcustody.verify.cli import _Progress
from taskcustody.verify.protocol_log import LOGGER, ProtocolLog, captured
from taskcustody.verify.run import Options, verify

ROOT = Path(__file__).resolve().parent.parent
#: A short run that still injects faults the protocol logs about (seeded: the same lines
#: every time): the stateful part alone, 20 examples of up to 20 steps, about 2 s.
SHORT = [
    "verify",
    "--no-model-check",
    "--no-fault-coverage",
    "--no-loops",
    "--examples",
    "20",
    "--steps",
    "20",
]
#: What the protocol logs about the injected faults (worker.py, recovery.py).
PROTOCOL_LINES = ("lost custody", "judged dead", "poison pill")


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str


def _invoke(*args: str) -> Run:
    """`taskcustody verify` in a process of its own: its real stderr, where Python's last-resort
    handler printed the protocol's warnings before (in-process, pytest's own log capture on the
    root logger would take them first)."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            p
            for p in (str(ROOT / "src"), str(ROOT / "model"), os.environ.get("PYTHONPATH", ""))
            if p
        ),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "taskcustody.cli", *SHORT, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


@dataclass
class Runs:
    default: Run
    verbose: Run
    page: str
    junit: ET.Element


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("verify-stderr")
    page, junit = tmp / "run.html", tmp / "run.xml"
    default = _invoke("--report", str(page), "--junit-xml", str(junit))
    verbose = _invoke("-v")
    yield Runs(default, verbose, page.read_text(), ET.parse(junit).getroot())


def _report_count(report: str) -> int:
    """The lines the report's protocol-log section counts."""
    found = re.search(r"^the protocol's own log.*: ([\d,]+) lines?:?$", report, re.M)
    assert found, report
    return int(found.group(1).replace(",", ""))


def test_quiet_prints_nothing_on_stderr_when_the_run_passes() -> None:
    run = _invoke("--quiet")
    assert run.code == 0, run.stdout + run.stderr
    assert "VERIFIED" in run.stdout
    assert _report_count(run.stdout) > 0  # faults were logged about: to the report
    assert run.stderr == ""


def test_the_default_run_prints_progress_but_no_protocol_log_line(runs: Runs) -> None:
    run = runs.default
    assert run.code == 0, run.stdout + run.stderr
    assert "stateful run..." in run.stderr
    for text in PROTOCOL_LINES:
        assert text not in run.stderr, run.stderr
    assert "protocol log:" not in run.stderr


def test_the_report_counts_the_protocol_log_lines_by_kind(runs: Runs) -> None:
    report = runs.default.stdout
    n = _report_count(report)
    assert n > 0
    section = report.split("the protocol's own log", 1)[1].split("\n\n", 1)[0]
    kinds = re.findall(r"^ +([\d,]+)  (WARNING|ERROR) +(taskcustody\.\w+): (.+)$", section, re.M)
    assert sum(int(count.replace(",", "")) for count, *_ in kinds) == n
    assert any("lost custody" in label and "judged dead" in label for *_, label in kinds), section
    assert "e.g. task t" in section  # each kind with its first line, values filled in


def test_verbose_prints_each_protocol_log_line_on_stderr(runs: Runs) -> None:
    run = runs.verbose
    assert run.code == 0, run.stdout + run.stderr
    lines = [x for x in run.stderr.splitlines() if x.startswith("protocol log: taskcustody.")]
    assert any("lost custody" in x and "judged dead" in x for x in lines), run.stderr
    assert len(lines) == _report_count(run.stdout)  # every line, and only those the report counts
    assert "stateful run..." in run.stderr  # the progress as well


def test_the_html_and_junit_reports_carry_the_protocol_log(runs: Runs) -> None:
    n = _report_count(runs.default.stdout)
    section = runs.page.split('<section id="protocol-log">', 1)[1].split("</section>", 1)[0]
    assert f"{n:,} lines" in section and "lost custody" in section
    suite = runs.junit.find("testsuite")
    assert suite is not None
    out = suite.findtext("system-out") or ""
    assert _report_count(out) == n and "lost custody" in out


def test_quiet_and_verbose_together_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, [*SHORT, "--quiet", "-v"])
    assert result.exit_code == 2
    assert "--quiet and --verbose" in result.stderr


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_run_keeps_the_protocol_log_from_the_callers_logging_and_gives_it_back() -> None:
    logger = logging.getLogger(LOGGER)
    root = logging.getLogger()
    mine, roots = _Kept(), _Kept()
    logger.addHandler(mine)
    root.addHandler(roots)
    old_level, old_root_level = logger.level, root.level
    logger.setLevel(logging.INFO)
    root.setLevel(logging.INFO)
    try:
        result = verify(
            Options(examples=20, steps=20, model_check=False, fault_coverage=False, loops=False)
        )
        assert result.ok and result.protocol_log.total > 0
        # Neither the logger's own handler nor the root's saw a line of the run.
        assert [r for r in mine.records + roots.records if r.name.startswith(LOGGER)] == []
        # ... and both have their logging back as it was.
        assert logger.handlers == [mine] and logger.propagate and logger.level == logging.INFO
        logging.getLogger("taskcustody.worker").warning("after the run")
        assert [r.getMessage() for r in mine.records] == ["after the run"]
        assert [r.getMessage() for r in roots.records] == ["after the run"]
    finally:
        logger.removeHandler(mine)
        root.removeHandler(roots)
        logger.setLevel(old_level)
        root.setLevel(old_root_level)


def test_the_protocol_log_counts_lines_by_logger_level_and_template() -> None:
    log = ProtocolLog()
    echoed: list[str] = []
    with captured(log, echoed.append):
        worker = logging.getLogger("taskcustody.worker")
        for task in ("t1", "t2", "t1"):
            worker.warning("task %s: lost custody in %s", task, "inflight:w0")
        logging.getLogger("taskcustody.recovery").error("poison pill: task %s", "t3")
        worker.info("below the level kept")
    assert log.total == 4
    first, second = log.by_count()
    assert (first.count, first.level, first.logger) == (3, "WARNING", "taskcustody.worker")
    assert first.label == "task ...: lost custody in ..."
    assert first.example == "task t1: lost custody in inflight:w0"
    assert (second.count, second.level, second.example) == (1, "ERROR", "poison pill: task t3")
    assert (
        echoed[0] == "protocol log: taskcustody.worker WARNING task t1: lost custody in inflight:w0"
    )
    assert len(echoed) == 4


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_protocol_log_line_goes_above_the_progress_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = _Progress(quiet=False, examples=20)
    progress.on_phase("stateful run")
    progress.log("protocol log: taskcustody.worker WARNING task t1: lost custody")
    # the progress line cleared, the log line in its place, the progress line again under it
    assert terminal.getvalue() == (
        "\r\x1b[Kstateful run..."
        "\r\x1b[Kprotocol log: taskcustody.worker WARNING task t1: "
        "lost custody\nstateful run..."
    )
