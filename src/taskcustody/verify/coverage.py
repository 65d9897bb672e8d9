"""What a run covered, part by part (`result.Part`): in the terminal and in the HTML report.

Said for every run, so that a run the time budget cut short (`--max-seconds`) reads as partial
at a glance, with the examples and steps it did run.
"""

from __future__ import annotations

import html

from .run import Result


def coverage_text(result: Result) -> str:
    lines = ["parts:"]
    width = max([52] + [len(p.name) for p in result.parts])  # names stay in one column
    for p in result.parts:
        note = f" -- {p.message}" if p.message else ""
        lines.append(
            f"  {p.name:{width}} {p.outcome.upper():8} {p.covered or '-'} ({p.seconds:.1f} s){note}"
        )
    if result.partial:
        done = sum(1 for p in result.parts if p.outcome in ("passed", "failed"))
        lines.append(f"coverage: PARTIAL ({done} of {len(result.parts)} parts run to the end)")
    return "\n".join(lines)


def coverage_html(result: Result) -> str:
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(p.name)}</td><td>{e(p.outcome)}</td><td>{e(p.covered)}</td>"
        f"<td>{p.seconds:.1f} s</td><td>{e(p.message)}</td></tr>"
        for p in result.parts
    )
    title = "Parts (PARTIAL: the time budget cut the run short)" if result.partial else "Parts"
    return f"<h2>{e(title)}</h2><table>{rows}</table>"


def with_coverage(page: str, result: Result) -> str:
    """The HTML report `page` with the parts table added at its end."""
    return page.replace("</body>", coverage_html(result) + "\n</body>", 1)
