"""The fenced code blocks of the documentation (README.md and docs/**/*.md), for the tests that
run them or check them against the code.

A block is skipped by the tests that run examples only when the line above its fence says so, in
an HTML comment the site does not show: `<!-- not-run: why -->`. The reason is required, so that a
reader of the source sees why a block is not checked."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(\S.*?)\s*-->$")
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)(.*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    body: str
    not_run: str | None  # the reason given by a `<!-- not-run: ... -->` line above the fence

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every top-level fenced block of a Markdown file. A fence of N backticks closes only on a
    line of at least N backticks, so a block may show another block (```` around ```)."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        ticks, language = match.group(1), match.group(2)
        above = lines[i - 1].strip() if i else ""
        reason = NOT_RUN.match(above)
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(rf"^{ticks}`*\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{path}:{start + 1}: a fence that is never closed"
        found.append(
            Block(
                path,
                start + 1,
                language,
                "\n".join(body) + "\n",
                reason.group(1) if reason else None,
            )
        )
        i += 1
    return found


def documentation() -> list[Path]:
    """README.md and every page under docs/, those that exist (the mutation gate's copy of the
    tree has neither)."""
    pages = [ROOT / "README.md"] if (ROOT / "README.md").exists() else []
    return pages + sorted((ROOT / "docs").rglob("*.md"))


def not_run_markers(path: Path) -> list[int]:
    """The lines (1-based) of every not-run marker outside a block (one inside a block is shown,
    not meant), to check that each one stands right above a block."""
    inside = {
        block.line + k for block in blocks(path) for k in range(1, block.body.count("\n") + 2)
    }
    return [
        n
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if NOT_RUN.match(line.strip()) and n not in inside
    ]
