"""The README is the front door: short, in the order a new user needs it, with a five-line example
that runs (tests/test_docs_examples.py runs it), commands and options that exist, links that lead
somewhere, and no history (that is CHANGELOG.md and git's)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from tests.support.commands import every_command
from tests.support.markdown import blocks

ROOT = Path(__file__).resolve().parent.parent
README_PATH = ROOT / "README.md"
# The mutation gate runs the suite in a copy without the README (mutation/gate.py, COPIED).
README = README_PATH.read_text() if README_PATH.exists() else ""
#: At most this long: what does not fit is a page of the documentation.
MAX_LINES = 300

pytestmark = pytest.mark.skipif(not README, reason="no README.md (e.g. the mutation gate's copy)")


def section(heading: str) -> str:
    start = README.index(f"\n{heading}\n")
    following = re.search(r"\n## ", README[start + 1 :])
    return README[start : start + 1 + following.start()] if following else README[start:]


def test_the_readme_is_a_front_door_in_the_order_a_new_user_needs() -> None:
    assert len(README.splitlines()) <= MAX_LINES
    headings = re.findall(r"^## .*$", README, re.M)
    assert headings == [
        "## Install",
        "## A first queue",
        "## The command line at a glance",
        "## `taskcustody verify` in your CI",
        "## The protocol",
        "## What is guaranteed, and what is not",
        "## Documentation",
    ]


def test_the_first_example_is_five_lines() -> None:
    [example] = [b for b in blocks(README_PATH) if b.language == "python"]
    assert example.not_run is None
    assert f"\n{example.body}" in section("## A first queue")
    assert len(example.body.strip().splitlines()) == 5


def test_the_protocol_is_drawn() -> None:
    assert "```mermaid\nsequenceDiagram" in section("## The protocol")


def test_every_relative_link_leads_to_a_file() -> None:
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    assert "docs/protocol.md" in links and "docs/validating-a-design.md" in links
    assert sorted(link for link in links if not (ROOT / link).exists()) == []


def test_the_cli_at_a_glance_shows_commands_and_options_that_exist() -> None:
    """Each line of the block is a real command, with options that command has."""
    [block] = [
        b for b in blocks(README_PATH) if b.language == "bash" and "taskcustody worker" in b.body
    ]
    commands = {path.removeprefix("taskcustody "): command for path, command, _ in every_command()}
    seen = set()
    for line in block.body.splitlines():
        words = shlex.split(line.split(" # ")[0].replace("[", "").replace("]", ""))
        command_line = words[words.index("taskcustody") + 1 :]
        name = command_line[0]
        if len(command_line) > 1 and f"{name} {command_line[1]}" in commands:
            name = f"{name} {command_line[1]}"
        assert name in commands, line
        seen.add(name)
        command = commands[name]
        spellings = {
            s
            for p in command.params
            if isinstance(p, click.Option)
            for s in (*p.opts, *p.secondary_opts)
        }
        for option in (w.split("=")[0] for w in command_line if w.startswith("--")):
            assert option in spellings, (name, option)
    assert {"enqueue", "worker", "status", "verify", "model-check"} <= seen


def _pages() -> list[Path]:
    return [README_PATH, *sorted((ROOT / "docs").rglob("*.md"))]


HISTORY = {
    "a tracker reference": re.compile(r"\bissue [0-9]+|(?<!\w)#[0-9]+"),
    "a date": re.compile(r"\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b"),
    "a commit hash": re.compile(r"(?:\bcommit |\bat |\bbefore |\bafter |`)[0-9a-f]{7,12}\b"),
}


@pytest.mark.parametrize("kind", sorted(HISTORY))
def test_no_history_in_the_readme_or_the_docs(kind: str) -> None:
    """History lives in CHANGELOG.md and git; figures in bench/results/, written by the commands
    that measure them. A page that quotes a run's date or commit goes stale the day after."""
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in _pages()
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if HISTORY[kind].search(line)
    ]
    assert found == [], kind


def test_the_history_patterns_can_fail() -> None:
    assert HISTORY["a tracker reference"].search("fixed in issue 15")
    assert HISTORY["a tracker reference"].search("see #12")
    assert HISTORY["a date"].search("run of 2026-12-01")
    assert HISTORY["a commit hash"].search("at `a15fa38` on 2 cores")
    assert HISTORY["a commit hash"].search("commit fb52da7, Redis 7")
    assert not HISTORY["a commit hash"].search("drop:EVALSHA/fdacc359/fetch:5:task")


def test_a_name_with_a_number_after_a_hash_is_not_a_tracker_reference() -> None:
    # Actor names such as "s0#1 w0" (server 0, incarnation 1) are not tracker numbers.
    assert not HISTORY["a tracker reference"].search('lifeline: "s0#1 w0"')
