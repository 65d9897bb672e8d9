"""The report of a failing run, read the way a person reads it: the HTML page's structure (parsed
with html.parser; the page was also looked at in a headless browser when it was built) and the
terminal text. A counterexample has one entry per step with its fault, the states after it in
words, the model's and Redis's, and the broken property with why it matters; the totals over
all examples are a section of their own."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from html.parser import HTMLParser

import pytest
from taskcustody_model.invariants import WHY

from taskcustody.verify.report import text_report
from taskcustody.verify.report_html import html_report
from taskcustody.verify.run import Options, Result, verify

VOID = {"meta", "br", "hr", "img", "input", "link"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def all_text(self) -> str:
        return " ".join([*self.text, *(c.all_text() for c in self.children)])

    def find(self, tag: str = "", cls: str = "", id: str = "") -> list[Node]:
        """Every descendant with this tag, class and id (each if given)."""
        out = []
        for c in self.children:
            if (
                (not tag or c.tag == tag)
                and (not cls or cls in c.classes)
                and (not id or c.attrs.get("id") == id)
            ):
                out.append(c)
            out += c.find(tag, cls, id)
        return out


class TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.root = Node("root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.stack[-1].text.append(data.strip())


def parse(page: str) -> Node:
    builder = TreeBuilder()
    builder.feed(page)
    builder.close()
    assert builder.stack == [builder.root], "unclosed elements"
    return builder.root


@pytest.fixture(scope="module")
def blpop_take() -> Result:
    """The design whose take is a BLPOP: the model checker loses the take's reply; on the real
    implementation the task is, after a take, in no Redis list at all."""
    result = verify(Options(variant="blpop-take", shrink_seconds=10))
    assert result.failure is not None and result.model is not None
    return result


def one(nodes: list[Node]) -> Node:
    assert len(nodes) == 1, nodes
    return nodes[0]


def test_the_stateful_counterexample_has_an_entry_per_step_with_fault_and_states(
    blpop_take: Result,
) -> None:
    assert blpop_take.failure is not None
    section = one(parse(html_report(blpop_take)).find("section", id="stateful-counterexample"))
    steps = section.find("li", cls="step")
    assert len(steps) == len(blpop_take.failure.steps)
    for step in steps:
        assert one(step.find("div", cls="fault")).all_text().startswith("fault: ")
        model = one(step.find("div", cls="model"))
        assert "task 0:" in model.all_text() and "server s0:" in model.all_text()
        assert step.find("div", cls="redis")
    last = steps[-1]
    # the take's task is in the model's in-flight list, and in Redis nowhere but in memory
    assert "task 0: in inflight:s0:0:w0" in one(last.find("div", cls="model")).all_text()
    redis_side = one(last.find("div", cls="redis")).all_text()
    assert "task 0: in no queue or list, and not committed" in redis_side
    assert "in that worker's memory only" in redis_side
    assert "that is a loss" in one(last.find("div", cls="difference")).all_text()
    prop = one(section.find("div", cls="property")).all_text()
    assert "no-loss" in prop and "in the state read from Redis" in prop and WHY["no-loss"] in prop
    assert "during recovery, after faults stopped" in prop
    # the example chose no step: the take is recovery's, after faults stopped, and said so
    assert "recovery" in last.classes
    entries = one(section.find("ol", cls="steps")).children
    assert "phase" in entries[entries.index(last) - 1].classes
    # the setup's state, before the first step
    start = one(section.find("li", cls="start")).all_text()
    assert "task 0: in the queue (1st to be taken)" in start


def test_the_model_counterexample_shows_the_lost_reply_on_the_take(blpop_take: Result) -> None:
    assert blpop_take.model is not None and blpop_take.model.violation is not None
    section = one(parse(html_report(blpop_take)).find("section", id="model-counterexample"))
    steps = section.find("li", cls="step")
    assert len(steps) == len(blpop_take.model.violation.steps)
    fault = one(steps[0].find("div", cls="fault"))
    assert "some" in fault.classes and "reply to take was lost" in fault.all_text()
    assert "dropped-reply:take" in one(section.find("p", cls="faults")).all_text()
    assert WHY["no-loss"] in one(section.find("div", cls="property")).all_text()


def with_other_faults(result: Result) -> Result:
    """`result` as if other examples of its run had injected faults its counterexample has
    not."""
    stats = copy.copy(result.stats)
    stats.faults = Counter({"crash_server": 5, "stall_server": 2})
    return dataclasses.replace(result, stats=stats)


def test_the_totals_are_a_section_apart_from_the_counterexamples(blpop_take: Result) -> None:
    result = with_other_faults(blpop_take)
    root = parse(html_report(result))
    totals = one(root.find("section", id="totals"))
    assert f"Totals over all {result.stats.examples} examples" in totals.all_text()
    assert "Faults injected, by kind" in totals.all_text()
    assert "crash_server 5" in totals.all_text()
    for section in root.find("section", cls="counterexample"):
        assert not section.find("section")  # nothing nested in a counterexample
        assert "crash_server" not in section.all_text()
        assert "faults in this counterexample" in section.all_text()
    stateful = one(root.find("section", id="stateful-counterexample"))
    assert "none" in one(stateful.find("p", cls="faults")).all_text()


def test_the_terminal_report_says_the_same_in_the_same_order(blpop_take: Result) -> None:
    out = text_report(with_other_faults(blpop_take))
    stateful = out.index("stateful run's counterexample")
    totals = out.index("totals over all")
    assert stateful < totals
    part = out[stateful:totals]
    assert (
        "property broken: no-loss (in the state read from Redis, during recovery, after "
        "faults stopped)"
    ) in part
    assert f"why it matters: {WHY['no-loss']}" in part
    assert "faults in this counterexample: none" in part
    # the example chose no step: the take is recovery's, after faults stopped
    assert (
        "  -- faults stop here: from now on the protocol's own steps run (recovery) until "
        "every task has committed --\n"
        "  1. server 0 (incarnation 0) worker 0: take  [recovery]\n"
        "       fault: none\n"
    ) in part
    assert "as read from Redis:\n         task 0: in no queue or list" in part
    assert "faults injected by kind" not in part and "crash_server" not in part
    assert "crash_server" in out[totals:]
