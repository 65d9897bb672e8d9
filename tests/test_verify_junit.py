"""`taskcustody verify --junit-xml FILE`: one test case per part and design, failures with the
counterexample, parts the budget did not reach skipped, and counts that agree with the cases."""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from click.testing import CliRunner
from taskcustody_model import Bounds

from taskcustody.cli.app import main
from taskcustody.verify.budget import Budget
from taskcustody.verify.junit import junit_xml
from taskcustody.verify.report import text_report
from taskcustody.verify.run import PASSED, Options, Result, verify

SMALL_MODEL = Bounds(2, 2, 1, 1, processes_per_server=1)
COUNTS = ("tests", "failures", "errors", "skipped", "time")


def parse(document: str) -> ET.Element:
    root = ET.fromstring(document.encode())
    check_counts(root)
    return root


def check_counts(root: ET.Element) -> None:
    """The simple schema CI readers rely on: every suite's (and the root's) tests, failures,
    errors and skipped are what its test cases say, and every case has a name and a time."""
    assert root.tag == "testsuites"
    for element in [root, *root.iter("testsuite")]:
        cases = list(element.iter("testcase"))
        for key in COUNTS:
            assert element.get(key) is not None, (element.tag, key)
        assert int(element.get("tests", "")) == len(cases)
        assert int(element.get("failures", "")) == sum(c.find("failure") is not None for c in cases)
        assert int(element.get("skipped", "")) == sum(c.find("skipped") is not None for c in cases)
        assert element.get("errors") == "0"
        float(element.get("time", ""))
    for case in root.iter("testcase"):
        assert case.get("name") and case.get("classname")
        float(case.get("time", ""))


def xml_of(*results: Result) -> ET.Element:
    return parse(junit_xml(list(results), text_report))


def test_a_passing_run_has_one_passing_case_per_part() -> None:
    root = xml_of(verify(Options(examples=3, steps=10, model_bounds=SMALL_MODEL)))
    [suite] = root.iter("testsuite")
    names = [c.get("name") for c in suite.iter("testcase")]
    assert names == [
        "model check",
        "stateful conformance on fakeredis",
        "production loops",
        "fault coverage",
    ]
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("4", "0", "0")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["design"] == "correct" and props["partial"] == "false"
    out = [c.findtext("system-out") for c in suite.iter("testcase")]
    # (Hypothesis may run one more than asked for, as the draws fall: the count is not pinned)
    assert re.match(r"covered: \d+ examples run \(3 asked for\), ", out[1] or ""), out[1]
    assert "faults of 13 kinds" in (out[3] or "")


def test_a_passing_part_with_a_remark_carries_it_in_its_output() -> None:
    result = verify(Options(examples=3, steps=10, model_bounds=SMALL_MODEL, fault_coverage=False))
    result.parts[0] = dataclasses.replace(
        result.parts[0],
        outcome=PASSED,
        covered="3 states",
        message="aimed at again, alone: redis_wipe",
    )
    [case, *_] = xml_of(result).iter("testcase")
    assert case.find("failure") is None
    assert case.findtext("system-out") == "covered: 3 states (aimed at again, alone: redis_wipe)"


def test_a_violation_is_a_failure_carrying_the_counterexample() -> None:
    result = verify(Options(examples=8, steps=15, model_check=False, variant="blpop-take"))
    assert result.failure is not None
    root = xml_of(result)
    [case] = root.iter("testcase")
    failure = case.find("failure")
    assert failure is not None
    assert result.failure.kind in failure.get("message", "")
    assert "stateful run's counterexample" in (failure.text or "")
    assert "reproduce: taskcustody verify" in (failure.text or "")
    assert root.get("failures") == "1"


def test_parts_the_budget_did_not_reach_are_skipped_with_the_reason() -> None:
    now = [0.0]
    budget = Budget(5, lambda: now[0])
    now[0] = 6.0
    result = verify(Options(examples=3, steps=10, model_bounds=SMALL_MODEL), budget=budget)
    root = parse(junit_xml([result], text_report, max_seconds=5))
    assert (root.get("tests"), root.get("skipped"), root.get("failures")) == ("4", "4", "0")
    for case in root.iter("testcase"):
        skipped = case.find("skipped")
        assert skipped is not None and "--max-seconds 5" in skipped.get("message", "")
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["partial"] == "true" and props["max-seconds"] == "5"


def test_the_cli_writes_one_suite_per_design(tmp_path: Path) -> None:
    path = tmp_path / "verify.xml"
    result = CliRunner().invoke(
        main,
        [
            "verify",
            "--examples",
            "8",
            "--steps",
            "15",
            "--quiet",
            "--no-model-check",
            "--variant",
            "correct",
            "--variant",
            "blpop-take",
            "--junit-xml",
            str(path),
            "--no-fault-coverage",
        ],
    )
    assert result.exit_code == 1, result.output  # a violation (the broken design, caught)
    assert f"JUnit XML written to {path}" in result.output
    root = parse(path.read_text(encoding="utf-8"))
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {
        "taskcustody verify --variant correct",
        "taskcustody verify --variant blpop-take",
    }
    assert suites["taskcustody verify --variant correct"].get("failures") == "0"
    assert suites["taskcustody verify --variant blpop-take"].get("failures") == "1"
    # correct: model check off, the stateful part and the production loops; blpop-take: stateful
    assert (root.get("tests"), root.get("failures")) == ("3", "1")
