"""docs/validating-a-design.md cannot go stale: every command it shows runs again here and must
print what the guide quotes (its property, its counterexample step by step), and every line of code
it quotes from the model is still in the file it names.

A quoted block may leave lines out with a line `...`; the lines between two such gaps must appear
together and in order, and a block that neither starts nor ends with `...` is the whole output.
Timings (`0.0s (2200 distinct states/s)`) differ from run to run and are not compared.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskcustody.cli.app import main
from tests.model.test_checker import PINNED

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "validating-a-design.md"
GAP = "..."
TIMING = re.compile(r"\d+\.\ds \(\d+ distinct states/s\)")
VIOLATION = re.compile(r"^property violated: ([\w-]+): ")
STEP = re.compile(r"^(\d+)\. ")


@dataclass(frozen=True)
class Command:
    line: str  # as the guide shows it, after "$ "
    quoted: tuple[str, ...]  # the output the guide quotes


@dataclass(frozen=True)
class CodeQuote:
    path: str  # relative to the repository root
    quoted: tuple[str, ...]


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block."""
    blocks: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```") and lines[i] != "```":
            language, body = lines[i][3:].strip(), []
            i += 1
            while lines[i] != "```":
                body.append(lines[i])
                i += 1
            blocks.append((language, body))
        i += 1
    return blocks


def commands(text: str) -> list[Command]:
    found: list[Command] = []
    for language, body in fenced_blocks(text):
        if language != "console":
            continue
        assert body and body[0].startswith("$ "), body[:1]
        starts = [n for n, line in enumerate(body) if line.startswith("$ ")] + [len(body)]
        for a, b in itertools.pairwise(starts):
            found.append(Command(body[a][2:], tuple(body[a + 1 : b])))
    return found


def code_quotes(text: str) -> list[CodeQuote]:
    found: list[CodeQuote] = []
    for language, body in fenced_blocks(text):
        if language == "python":
            assert body[0].startswith("# "), f"a quoted block names its file first: {body[0]!r}"
            found.append(CodeQuote(body[0][2:], tuple(body[1:])))
    return found


def normalised(lines: list[str] | tuple[str, ...]) -> list[str]:
    return [TIMING.sub("<timing>", line.rstrip()) for line in lines]


def mismatch(quoted: tuple[str, ...], actual: list[str]) -> str | None:
    """Why `quoted` (with `...` gaps) is not the actual text, or None if it is."""
    quoted_lines = normalised(quoted)
    actual_lines = normalised(actual)
    while actual_lines and not actual_lines[-1]:
        actual_lines.pop()
    segments: list[list[str]] = [[]]
    for line in quoted_lines:
        if line.strip() == GAP:
            segments.append([])
        else:
            segments[-1].append(line)
    anchored_start = bool(segments[0])
    anchored_end = bool(segments[-1])
    at = 0
    for n, segment in enumerate(segments):
        if not segment:
            continue
        if n == 0 and anchored_start:
            hits = [0] if actual_lines[: len(segment)] == segment else []
        else:
            hits = [
                k
                for k in range(at, len(actual_lines) - len(segment) + 1)
                if actual_lines[k : k + len(segment)] == segment
            ]
        if n == len(segments) - 1 and anchored_end:
            hits = [k for k in hits if k + len(segment) == len(actual_lines)]
        if not hits:
            return "not found in this place of the output:\n" + "\n".join(segment)
        at = hits[0] + len(segment)
    return None


def run(command: Command) -> tuple[int, list[str]]:
    argv = shlex.split(command.line)
    assert argv[0] == "taskcustody", command.line
    result = CliRunner().invoke(main, argv[1:])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout.splitlines()


def counterexample(lines: list[str] | tuple[str, ...]) -> tuple[str | None, int]:
    """The property a model-check output (or a quote of one) says is violated, and its last
    numbered step (0 if none)."""
    prop = next((m.group(1) for line in lines if (m := VIOLATION.match(line))), None)
    steps = [int(m.group(1)) for line in lines if (m := STEP.match(line))]
    return prop, max(steps, default=0)


if not GUIDE.exists():  # the mutation gate's copy of the tree has no docs/
    pytest.skip("no docs/ (e.g. the mutation gate's copy)", allow_module_level=True)
TEXT = GUIDE.read_text()
COMMANDS = commands(TEXT)
CODE = code_quotes(TEXT)


def test_the_guide_shows_commands_and_code() -> None:
    """The parsing above found what the guide is made of: a guide with no commands would make the
    tests below pass vacuously."""
    assert len(COMMANDS) >= 6
    assert len(CODE) >= 3
    assert any("property violated" in line for c in COMMANDS for line in c.quoted)
    assert any("all properties hold" in line for c in COMMANDS for line in c.quoted)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.line for c in COMMANDS])
def test_each_command_prints_what_the_guide_quotes(command: Command) -> None:
    code, output = run(command)
    why = mismatch(command.quoted, output)
    assert why is None, f"$ {command.line}\n{why}\n--- actual output:\n" + "\n".join(output)
    # The exit status the guide states: 1 with a counterexample, else 0.
    prop, _ = counterexample(output)
    assert code == (1 if prop else 0), (command.line, code)


@pytest.mark.parametrize(
    "command", [c for c in COMMANDS if counterexample(c.quoted)[0]], ids=lambda c: c.line
)
def test_each_quoted_counterexample_has_its_property_and_length(command: Command) -> None:
    """Said twice on purpose: the gap-matching above could accept a quote that trims the last
    steps away; here the quoted property and last step number must be the run's."""
    _, output = run(command)
    assert counterexample(command.quoted) == counterexample(output)


def test_the_default_bounds_counterexample_is_the_pinned_one() -> None:
    """The guide says design 2's counterexample at the default bounds is the one CI pins."""
    [default] = [c for c in COMMANDS if c.line == "taskcustody model-check --variant no-release"]
    assert counterexample(default.quoted) == PINNED["no-release"]


@pytest.mark.parametrize("quote", CODE, ids=[f"{q.path}:{q.quoted[0].strip()}" for q in CODE])
def test_each_code_quote_is_in_the_file_it_names(quote: CodeQuote) -> None:
    source = (ROOT / quote.path).read_text().splitlines()
    why = mismatch((GAP, *quote.quoted, GAP), source)
    assert why is None, f"{quote.path}: {why}"


def test_the_readme_links_the_guide() -> None:
    assert "(docs/validating-a-design.md)" in (ROOT / "README.md").read_text()


def test_mismatch_finds_a_changed_line_and_a_trimmed_end() -> None:
    """The matcher can fail: a changed line, a missing line, lines out of order, a quote that
    stops early without saying so."""
    actual = ["a", "b", "c", "d"]
    assert mismatch(("a", "b", "c", "d"), actual) is None
    assert mismatch(("a", GAP, "d"), actual) is None
    assert mismatch((GAP, "b", "c", GAP), actual) is None
    assert mismatch(("a", "x", "c", "d"), actual) is not None
    assert mismatch(("a", "c", GAP), actual) is not None
    assert mismatch(("a", GAP, "c", GAP, "b"), actual) is not None
    assert mismatch(("a", "b"), actual) is not None
    assert mismatch(("1.5s (10 distinct states/s)",), ["0.0s (2200 distinct states/s)"]) is None
