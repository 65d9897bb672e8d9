"""Every property the checker can report has its one sentence of why it matters
(`invariants.WHY`), which reports print beside a counterexample."""

from __future__ import annotations

import re

from taskcustody_model.invariants import INVARIANTS, WHY

#: The step property (`check_transition`) and the checker's eventual property.
OTHER_PROPERTIES = {"prompt-recovery", "eventual-recovery"}


def test_every_property_has_a_sentence_and_nothing_else_does() -> None:
    assert set(WHY) == set(INVARIANTS) | OTHER_PROPERTIES


def test_each_reason_is_one_sentence() -> None:
    for name, why in WHY.items():
        assert why.endswith(".") and why[0].isupper(), name
        assert not re.search(r"\.\s", why), f"{name}: more than one sentence"
