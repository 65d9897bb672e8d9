"""Waiting for a condition in end-to-end tests: a bounded poll, never a timed assertion."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    predicate: Callable[[], object],
    what: str,
    limit: float = 120.0,
    state: Callable[[], object] | None = None,
) -> None:
    """Poll `predicate` every 50 ms until it holds; give up with an AssertionError naming `what`
    (and what `state` returns then, to show where things stand) after `limit` seconds: a generous
    bound on a shared machine, not a claim about speed."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            seen = "" if state is None else f"; {_describe(state)}"
            raise AssertionError(f"gave up waiting for {what}{seen}")
        time.sleep(0.05)


def _describe(state: Callable[[], object]) -> str:
    # A diagnostic that fails must not hide the failure it was to explain.
    try:
        return str(state())
    except Exception as exc:
        return f"(state unavailable: {exc!r})"
