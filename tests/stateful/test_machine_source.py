"""A stateful run draws from its explicit seed, not from the machine's source text.

Hypothesis's `derandomize` seeds a run from a digest of the machine class's source, comments
included; the runs of `taskcustody verify` and of the tests pass a seed instead
(`verify/seeding.py`). Here machine.py is loaded a second time with a comment added to the
machine's class body and a helper of its rules renamed: Hypothesis digests the two classes
differently, and yet a seeded run of each takes the very same steps and injects the very same
faults. The control: the same two runs derandomized do differ, so the comparison can fail.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.internal.reflection import function_digest
from hypothesis.stateful import get_state_machine_test

from taskcustody.deploy.connection import connect_fake
from taskcustody.verify import machine as machine_module
from taskcustody.verify.seeding import DEFAULT_SEED, no_local_constants, run_machine, seeded_test
from taskcustody.verify.stats import RunStats

#: Small, so that both runs stay quick; enough steps for faults among them.
EXAMPLES, STEPS = 8, 15


def _settings(derandomize: bool = False) -> settings:
    return settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        derandomize=derandomize,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


class _Recorded(RunStats):
    """RunStats that also keep every example's steps, in words."""

    def __init__(self) -> None:
        super().__init__()
        self.examples_steps: list[list[str]] = []

    def add(self, h: Any) -> None:
        super().add(h)
        self.examples_steps.append([s.text for s in h.steps])


@pytest.fixture(scope="module")
def altered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """machine.py with a comment added to the machine's class body and its rules' helper `_do`
    renamed, imported from a file of its own as a module of the same package."""
    source = Path(machine_module.__file__).read_text(encoding="utf-8")
    edited = source.replace(
        "        @initialize()\n",
        "        # a comment that changes nothing but the source text\n        @initialize()\n",
        1,
    )
    edited = edited.replace("self._do(", "self._perform(").replace("def _do(", "def _perform(")
    assert edited.count("self._perform(") > 10 and "_do(" not in edited
    name = "taskcustody.verify._machine_altered_by_a_test"
    path = tmp_path_factory.mktemp("altered") / "machine.py"
    path.write_text(edited, encoding="utf-8")
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


def _run(module: ModuleType, *, derandomize: bool = False) -> _Recorded:
    server = fakeredis.FakeServer()
    stats = _Recorded()
    machine = module.build_machine(lambda: connect_fake(server), stats=stats)
    if derandomize:  # the way the runs were seeded before: from the class's source
        test: Any = get_state_machine_test(machine, settings=_settings(derandomize=True))
        with no_local_constants():
            test()
    else:
        run_machine(machine, _settings(), DEFAULT_SEED)
    assert stats.examples > 0
    return stats


def _machine_class(module: ModuleType) -> type:
    return module.build_machine(lambda: None)  # type: ignore[no-any-return]


def test_the_altered_machine_reads_differently_to_hypothesis(altered: ModuleType) -> None:
    original, edited = _machine_class(machine_module), _machine_class(altered)
    assert original.__name__ == edited.__name__ == "CustodyMachine"
    assert function_digest(original) != function_digest(edited)


def test_a_seeded_run_takes_the_same_steps_whatever_the_source_text_says(
    altered: ModuleType,
) -> None:
    before, after = _run(machine_module), _run(altered)
    assert sum(map(len, before.examples_steps)) > EXAMPLES  # (the runs did step)
    assert after.examples_steps == before.examples_steps
    assert after.faults == before.faults and sum(before.faults.values()) > 0
    assert Counter(after.tallies) == Counter(before.tallies)


def test_derandomized_the_same_two_runs_differ(altered: ModuleType) -> None:
    """The control: seeded from the source text, the comment alone moves the draws."""
    before, after = _run(machine_module, derandomize=True), _run(altered, derandomize=True)
    assert after.examples_steps != before.examples_steps


def test_a_run_cannot_be_seeded_from_the_source_text() -> None:
    machine = _machine_class(machine_module)
    with pytest.raises(ValueError, match="pass a seed"):
        seeded_test(machine, _settings(derandomize=True), seed=None)
    seeded_test(machine, _settings(derandomize=True), seed=DEFAULT_SEED)  # (the seed wins)
