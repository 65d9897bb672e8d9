"""The machine with refusals: the state machine and rules that attempt what the model refuses,
one whatever the draws reach and one that walks to each kind not yet attempted
(refusal_aiming.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from .aiming import walked
from .refusal_aiming import AIM_ORDER, walk_to_refusal

#: How many copies of the refusal-aiming rule the machine with refusals has (their weight among
#: the rules, while a kind is left to aim at in the example).
REFUSAL_AIMING_RULES = 3


def with_refusals(base: type[RuleBasedStateMachine]) -> type[RuleBasedStateMachine]:
    """`base` and a rule that attempts what the model refuses: a claim of an
    id a live process holds, a heartbeat from a superseded process, a sweep's drain of a live
    list (`taskcustody_model.refused_attempts`). The implementation must refuse it
    (`Harness.attempt` raises `Mismatch("refusal", ...)` if not) and leave Redis as the model,
    unchanged, says (the invariant's check after the rule). A second rule aims at each kind not
    yet attempted in the example (verify/refusal_aiming.py): it walks, planned on the model, to
    a state where such an attempt is refused, so that every kind is attempted whatever the draws
    (a superseded process's heartbeat needs a stall, a lapsed lease, a new claim and a resume).

    A subclass, not a rule of `base`: Hypothesis draws a rule by its index among the machine's
    rules, so one more rule in `base` would change what every seeded run of it draws (the broken
    designs' pinned runs among them). The runs that want refusals ask for them
    (`build_machine`'s `refusals`)."""

    class RefusingMachine(base):  # type: ignore[valid-type, misc]
        """... and attempts what the model refuses: whatever the draws reach
        (`attempt_refused`), and each kind not yet attempted in this example, walked to
        (`_aim_at_a_refusal`)."""

        @precondition(lambda self: bool(self.h.refused()))
        @rule(data=st.data())
        def attempt_refused(self, data: st.DataObject) -> None:
            options = self.h.refused()
            attempt = options[data.draw(st.integers(0, len(options) - 1), label="which attempt")]
            self.failed = True  # until the implementation refused it
            self.h.attempt(attempt)
            self.failed = False

        def _refusals_to_aim_at(self) -> list[str]:
            """The kinds not yet attempted in this example, nor found out of reach in it."""
            out_of_reach: set[str] = getattr(self, "_out_of_reach", set())
            return [k for k in AIM_ORDER if not self.h.refusals[k] and k not in out_of_reach]

        def _aim_at_a_refusal(self, data: st.DataObject) -> None:
            """Plans on the model a shortest walk to a state where an attempt of a kind not yet
            made in this example is refused (`refusal_aiming.walk_to_refusal`), performs it
            step by step on the implementation, each step checked, and makes the attempt. A
            kind with no walk within the planner's bounds is not aimed at again in this
            example."""
            for kind in self._refusals_to_aim_at():
                walk = walk_to_refusal(self.h.state, self.h.config, kind)
                if walk is not None:
                    break
                self._out_of_reach = {*getattr(self, "_out_of_reach", ()), kind}
            else:
                return
            if not walked(self, walk):
                return
            options = [a for a in self.h.refused() if a.name == kind]
            if not options:
                return
            attempt = options[data.draw(st.integers(0, len(options) - 1), label="which attempt")]
            self.failed = True  # until the implementation refused it
            self.h.attempt(attempt)
            self.failed = False

    # (copies of the aiming rule: Hypothesis draws a rule uniformly among those enabled, and
    # each copy is enabled only while a kind is left to aim at in the example)
    for n in range(REFUSAL_AIMING_RULES):

        def aim(self: Any, data: st.DataObject) -> None:
            self._aim_at_a_refusal(data)

        aim = precondition(lambda self: bool(self._refusals_to_aim_at()))(aim)
        aim.__name__ = f"aim_at_a_refusal_{n}"
        setattr(RefusingMachine, aim.__name__, rule(data=st.data())(aim))
    RefusingMachine.__name__ = f"Refusing{base.__name__}"
    return RefusingMachine
