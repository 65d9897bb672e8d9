"""A time budget for `taskcustody verify --max-seconds N`, with an injectable clock.

The budget is checked only at clean points: between the parts of a run, between two progress
reports of the model check, and between two stateful examples (never inside an example, whose
Redis state would be left half-checked). A part cut short says so, and how much it covered.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

#: Seconds from an arbitrary origin; `time.monotonic` unless a test injects its own.
Clock = Callable[[], float]


class BudgetSpent(KeyboardInterrupt):
    """Raised at a clean point to end a part when the budget is spent.

    A KeyboardInterrupt because that is what Hypothesis lets through untouched: any other
    exception raised between two examples would be recorded as a failing (or flaky) example
    and shrunk. `run.verify` catches it; it never leaves a run."""


class Budget:
    """`seconds` from the moment it is made (None: no limit), measured by `clock`; `option` is
    how the user set it, for the messages."""

    def __init__(
        self,
        seconds: float | None = None,
        clock: Clock = time.monotonic,
        option: str = "--max-seconds",
    ) -> None:
        if seconds is not None and (math.isnan(seconds) or seconds <= 0):
            raise ValueError(f"a time budget must be a number of seconds > 0, not {seconds!r}")
        self.seconds = seconds
        self.clock = clock
        self.option = option
        self.started = clock()

    @property
    def limited(self) -> bool:
        return self.seconds is not None

    def elapsed(self) -> float:
        return self.clock() - self.started

    def remaining(self) -> float:
        """Seconds left (infinite without a limit, never below 0)."""
        if self.seconds is None:
            return math.inf
        return max(0.0, self.seconds - self.elapsed())

    def spent(self) -> bool:
        return self.seconds is not None and self.elapsed() >= self.seconds

    def check(self) -> None:
        """Raise BudgetSpent if the budget is spent (call it only at a clean point)."""
        if self.spent():
            raise BudgetSpent(f"the time budget of {self.seconds:g} s is spent")

    def label(self) -> str:
        return f"the time budget ({self.option} {self.seconds:g})"

    def reason(self) -> str:
        return f"not run: {self.label()} was spent"
