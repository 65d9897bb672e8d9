"""`taskcustody verify --junit-xml FILE`: the run as a JUnit XML report, for CI systems.

One `<testsuite>` per design run, one `<testcase>` per part of it (`result.Part`): the model check,
the stateful conformance run on its backend, the fault coverage (its minimums unmet: a failure).
A part that found a violation has a `<failure>`
whose text is the run's report (the counterexample and the command that reproduces it); one that
the time budget did not reach, or cut short in the model check, is `<skipped>` with the reason; a
stateful part the budget cut short between examples passed what it covered, and its
`<system-out>` says how much that was. The suite's own `<system-out>` counts the protocol's log
lines by kind (protocol_log.py). Built with the standard library only.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence

from .run import FAILED, PARTIAL, PASSED, SKIPPED, Result


def _counts(cases: Sequence[ET.Element]) -> dict[str, str]:
    failures = sum(1 for c in cases if c.find("failure") is not None)
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    seconds = sum(float(c.get("time", "0")) for c in cases)
    return {
        "tests": str(len(cases)),
        "failures": str(failures),
        "errors": "0",
        "skipped": str(skipped),
        "time": f"{seconds:.3f}",
    }


def _suite(
    result: Result, details: Callable[[Result], str], max_seconds: float | None
) -> ET.Element:
    design = result.options.variant
    suite = ET.Element("testsuite", name=f"taskcustody verify --variant {design}")
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("design", design),
        ("backend", result.versions.get("server", result.backend)),
        ("partial", "true" if result.partial else "false"),
        ("max-seconds", "none" if max_seconds is None else f"{max_seconds:g}"),
        ("reproduce", result.options.command()),
    ):
        ET.SubElement(props, "property", name=name, value=value)
    cases: list[ET.Element] = []
    for part in result.parts:
        case = ET.SubElement(
            suite,
            "testcase",
            name=part.name,
            classname=f"taskcustody.verify.{design}",
            time=f"{part.seconds:.3f}",
        )
        if part.outcome == FAILED:
            failure = ET.SubElement(case, "failure", message=part.message, type="violation")
            failure.text = details(result)
        elif part.outcome == SKIPPED:
            ET.SubElement(case, "skipped", message=part.message)
        if part.covered or part.outcome == PARTIAL:
            out = ET.SubElement(case, "system-out")
            remark = (
                f" (partial: {part.message})"
                if part.outcome == PARTIAL
                else f" ({part.message})"
                if part.outcome == PASSED and part.message
                else ""
            )
            out.text = f"covered: {part.covered}{remark}"
        cases.append(case)
    if result.options.stateful:
        # The protocol's own warnings and errors (what the injected faults made it log), for
        # the whole run: its parts share the loggers.
        ET.SubElement(suite, "system-out").text = "\n".join(result.protocol_log.lines())
    for key, value in _counts(cases).items():
        suite.set(key, value)
    return suite


def junit_xml(
    results: Sequence[Result], details: Callable[[Result], str], max_seconds: float | None = None
) -> str:
    """The JUnit XML document of `results` (one per design). `details(result)`: the text of a
    failure (the text report, with its counterexample)."""
    root = ET.Element("testsuites", name="taskcustody verify")
    suites = [_suite(r, details, max_seconds) for r in results]
    root.extend(suites)
    cases = [c for s in suites for c in s.iter("testcase")]
    for key, value in _counts(cases).items():
        root.set(key, value)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
