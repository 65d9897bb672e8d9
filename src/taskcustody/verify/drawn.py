"""The drivers' choices, drawn by the state machine: what a production loop's driver (loops.py,
prefetch_loop.py, server_loop.py) and a drain's interleaving (`Harness.step(interleave=...)`)
leave to chance. Each draw shrinks to its "no" (nothing lost, nobody steps, the loop goes on)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st
from taskcustody_model.protocol import Action


class DrawnChoices:
    """The loop driver's choices (`loops.Choices`), drawn; each shrinks to "no"."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def stop(self) -> bool:
        return self.data.draw(st.integers(0, 3), label="stop the loop") == 1

    def lose(self, action: Action) -> bool:
        return self.data.draw(st.integers(0, 2), label=f"lose the {action.command} reply") == 1

    def interleave(self, options: list[Action]) -> Action | None:
        # one time in two, nobody else steps (what it shrinks to)
        k = self.data.draw(st.integers(0, 2 * len(options) - 1), label="another actor steps")
        return options[k - len(options)] if k >= len(options) else None


class DrawnPrefetchChoices(DrawnChoices):
    """The prefetching-loop driver's choices (`prefetch_loop.PrefetchChoices`), drawn."""

    def lose_at(self, positions: list[int]) -> int | None:
        if not self.data.draw(st.booleans(), label="a pipeline reply is lost"):
            return None
        return self.data.draw(st.sampled_from(positions), label="at slot")


class DrawnServerChoices(DrawnChoices):
    """The server-loop driver's choices (`server_loop.ServerChoices`), drawn."""

    def variant(self) -> int:
        return self.data.draw(st.integers(0, 5), label="heartbeat variant")

    def drop_at(self) -> int:
        return self.data.draw(st.integers(0, 3), label="sweep drop at")


def drawn_interleaving(data: st.DataObject) -> Callable[[list[Action]], Action | None]:
    """What a drain's owner does between two moves, drawn. 0 is "nothing" (what it shrinks to);
    anything else picks a step, so that the owner steps more often than not: catching an unbounded
    drain takes two or three steps in a row (record, release, take the task back)."""

    def choose(options: list[Action]) -> Action | None:
        k = data.draw(st.integers(0, 3 * len(options)), label="worker step during the drain")
        return options[(k - 1) % len(options)] if k else None

    return choose
