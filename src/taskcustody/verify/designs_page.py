"""The table of broken designs on docs/model.md, written from the designs table
(`taskcustody.verify.designs`) so that the page cannot drift from it.

    python -m taskcustody.verify.designs_page [PAGE]          rewrite the table in PAGE
    python -m taskcustody.verify.designs_page --check [PAGE]  exit 1 if PAGE's table is stale

PAGE defaults to docs/model.md; the table goes between its two markers (`BEGIN`, `END`), and the
rest of the page is written by hand. tests/test_designs_table.py fails while the page is stale."""

from __future__ import annotations

import sys
from pathlib import Path

from taskcustody_model.trace import describe_bounds

from taskcustody.verify.designs import DESIGNS, Design

BEGIN = "<!-- designs:begin (written by python -m taskcustody.verify.designs_page) -->"
END = "<!-- designs:end -->"
DEFAULT_PAGE = Path("docs") / "model.md"


def _row(design: Design) -> str:
    change = design.variant.description.split(". ", 1)[1]
    stateful = "finds it" if design.stateful is not None else "cannot drive it"
    mutant = f"`{design.name}`" if design.mutant else ""
    bounds = describe_bounds(design.pinned.bounds)
    return (
        f"| {design.number} | `{design.name}` | {change} | **{design.pinned.property}** | "
        f"{bounds} | {design.pinned.length} | {stateful} | {mutant} |"
    )


def table() -> str:
    """The markdown table, one row per design in its protocol.md order, between the markers."""
    lines = [
        BEGIN,
        "| # | `--variant` | the change | breaks | its own bounds | model's counterexample (steps) "
        "| stateful run | named mutant |",
        "|---:|---|---|---|---|---:|---|---|",
        *(_row(design) for design in DESIGNS),
        END,
    ]
    return "\n".join(lines)


def rewritten(text: str) -> str:
    """`text` with the table between its markers replaced by `table()`."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not (begin and end):
        raise ValueError(f"the page has no {BEGIN!r} ... {END!r} markers")
    return head + table() + tail


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    paths = [a for a in args if a != "--check"]
    usage = "usage: python -m taskcustody.verify.designs_page [--check] [PAGE]"
    if any(a.startswith("-") for a in paths) or len(paths) > 1:
        print(usage, file=sys.stderr)
        return 0 if paths in (["--help"], ["-h"]) else 2
    page = Path(paths[0]) if paths else DEFAULT_PAGE
    try:
        text = page.read_text()
        new = rewritten(text)
    except (OSError, ValueError) as exc:
        print(f"{page}: {exc}", file=sys.stderr)
        return 2
    if check:
        if new != text:
            print(
                f"{page}: the designs table is stale: python -m taskcustody.verify.designs_page",
                file=sys.stderr,
            )
            return 1
        return 0
    page.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
