"""What a stateful run counts (`RunStats`), summed over its examples as each one ends."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .harness import Harness, StepRecord


@dataclass
class RunStats:
    """Totals over every example of a run (Hypothesis's `event` counts examples, not steps)."""

    examples: int = 0
    steps: int = 0
    recovery_steps: int = 0
    seconds_in_steps: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    #: attempts the model refuses, made and refused (`Harness.attempt`), by kind
    refusals: Counter[str] = field(default_factory=Counter)
    tallies: Counter[str] = field(default_factory=Counter)
    #: worker steps run between two moves of a drain (`Harness.steps_during_drains`)
    steps_during_drains: int = 0
    last_steps: list[StepRecord] = field(default_factory=list)
    last_error: str = ""
    #: the tallies of the last example as it stood when it ended (a failing example included)
    last_tallies: dict[str, int] = field(default_factory=dict)

    def add(self, h: Harness) -> None:
        self.examples += 1
        self.steps += len(h.steps)
        self.seconds_in_steps += h.seconds
        self.steps_during_drains += h.steps_during_drains
        self.faults.update(h.counts)
        self.refusals.update(h.refusals)
        self.last_steps = list(h.steps)
