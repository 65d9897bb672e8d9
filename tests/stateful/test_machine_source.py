"""The machines' source text is part of the seed of their derandomized runs: Hypothesis digests a
state machine class's source (`function_digest`), comments included, and derives a derandomized
run's draws from it. The stateful pins (tests/stateful, the designs table, the README's figures)
were measured with exactly these classes; an edit of a class body moves every one of them, in ways
that show up far from the edit (a fault kind that no longer fires, a design found later). This
test says so at once: after a deliberate edit, re-measure the pins and then update the digest."""

from __future__ import annotations

import hashlib
import inspect

import pytest

from taskcustody.verify.machine import RETRY_BOUNDS, build_machine

#: sha1 of each machine class's source, as measured with the pins (CustodyMachine's since its
#: dead `execute` rule was deleted, 2026-12-02; the others unchanged since f6c714c)
PINNED = {
    "CustodyMachine": "2a8644e07d56752a4d1cbb9ac72dcc750066195c",
    "PrefetchingCustodyMachine": "76bc54d2fab68430c5823121490db751f8444606",
    "RetryingCustodyMachine": "6f71b8a556a2c97a9193d5abe4ef4313d859ab02",
}


@pytest.mark.parametrize("options", [{}, {"prefetching": True}, {"bounds": RETRY_BOUNDS}],
                         ids=["plain", "prefetching", "retrying"])
def test_the_machine_classes_are_the_ones_the_pins_were_measured_with(
        options: dict[str, object]) -> None:
    machine = build_machine(lambda: None, **options)  # type: ignore[arg-type, return-value]
    for cls in machine.__mro__:
        if cls.__module__ == "taskcustody.verify.machine":
            digest = hashlib.sha1(inspect.getsource(cls).encode()).hexdigest()
            assert digest == PINNED[cls.__name__], (
                f"{cls.__name__}'s source changed: every derandomized run of it draws other "
                "examples now. Re-measure the stateful pins, then update PINNED here.")
