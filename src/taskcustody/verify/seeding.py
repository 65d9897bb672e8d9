"""Running a state machine reproducibly, from an explicit seed.

Every stateful run of `taskcustody verify` and of the tests draws from an explicit seed
(`DEFAULT_SEED` unless told otherwise, `Options.seed`, `designs.Stateful.seed`). Hypothesis's
`derandomize` is not used: it seeds a run from a digest of the machine class's source text,
comments included, so that an edit that changes no behaviour (a comment, a renamed helper) would
move every draw. With an explicit seed, what a run draws depends on what the machine does (its
rules, their order and their strategies), never on how its source is written;
tests/stateful/test_machine_source.py proves it. What each run must reach (every fault kind, every
refused attempt, the broken designs' bugs) is carried by the aiming rules (aiming.py,
refusal_aiming.py) and checked by the coverage gates, not by the luck of one seed.

Two more things Hypothesis would mix into the draws are kept out: the literals of every imported
module (`no_local_constants`), and its shrinking time cap is the caller's (`shrink_budget`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

#: The seed of a run that names none (`taskcustody verify` without `--seed`, the tests).
DEFAULT_SEED = 0


def seeded_test(
    machine: type[RuleBasedStateMachine], the_settings: Settings, seed: int | None = DEFAULT_SEED
) -> Callable[[], None]:
    """The test that runs `machine` with `the_settings`, drawing from `seed` (None: a random
    seed, Hypothesis's own). A seed overrides the settings' `derandomize`; without one,
    `derandomize` is refused: it would seed the run from the machine's source."""
    if seed is None and the_settings.derandomize:
        raise ValueError("derandomize seeds a run from the machine's source; pass a seed")
    make_test: Any = get_state_machine_test  # (untyped in Hypothesis)
    test: Callable[[], None] = make_test(machine, settings=the_settings)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    return test


def run_machine(
    machine: type[RuleBasedStateMachine], the_settings: Settings, seed: int | None = DEFAULT_SEED
) -> None:
    """Run `machine` as a test (`seeded_test`), without the imported modules' literals among its
    draws (`no_local_constants`); raises what the failing example raised."""
    test = seeded_test(machine, the_settings, seed)
    with no_local_constants():
        test()


@contextlib.contextmanager
def shrink_budget(seconds: float) -> Iterator[None]:
    """Cap Hypothesis's shrinking time (a module constant of its engine, 300 s by default)."""
    from hypothesis.internal.conjecture import engine

    old = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = int(max(1, seconds))
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = old


@contextlib.contextmanager
def no_local_constants() -> Iterator[None]:
    """Hypothesis mixes literals found in every imported module of this project into what it
    draws, so a seeded run would change with whatever else is imported (a test run of one file
    and of all of `tests/` differed) and with any edit of any literal anywhere. Without them a
    seeded run depends only on the machine. (Hypothesis internals, as of 6.170.)"""
    from hypothesis.internal.conjecture import providers as _providers

    providers: Any = _providers
    original = getattr(providers, "_get_local_constants", None)
    if original is None:  # a Hypothesis without local constants
        yield
        return
    providers._get_local_constants = providers.Constants
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()
