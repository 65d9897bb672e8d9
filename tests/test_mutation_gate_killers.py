"""The gate's recorded killers (mutation/killers.json): which test each named mutant's run starts
with. They only order a run (tests/test_mutation_pytest_plugin.py checks a passing one lets the
run go on), so a stale entry shows as a note and a slower run, never as another verdict.

And `--confirm-kills` (CI, after the whole suite ran green): no whole-suite run on the unmutated
copy, but every test that caught a mutant must pass there, or the gate fails."""

from __future__ import annotations

from pathlib import Path

from mutation.gate import (
    KILLERS,
    NamedResult,
    confirm_kills,
    killers_moved,
    load_killers,
    record_killers,
)
from mutation.named import MUTANTS

ROOT = Path(__file__).resolve().parent.parent


def _killed(name: str, test: str) -> NamedResult:
    mutant = next(m for m in MUTANTS if m.name == name)
    return NamedResult(mutant, "killed", True, [{"test": test, "when": "call", "message": ""}])


def test_every_recorded_killer_names_a_mutant_and_a_test_file_of_this_tree() -> None:
    killers = load_killers(ROOT)
    names = {m.name for m in MUTANTS}
    assert set(killers) <= names
    for tests in killers.values():
        for test in tests:
            assert (ROOT / test.split("::")[0]).is_file(), test


def test_a_killer_other_than_the_recorded_one_is_reported_as_moved() -> None:
    name = MUTANTS[0].name
    killers = {name: ["tests/test_a.py::test_x"]}
    assert killers_moved([_killed(name, "tests/test_a.py::test_x")], killers) == []
    assert killers_moved([_killed(name, "tests/test_b.py::test_y")], killers) == [name]
    assert killers_moved([_killed(name, "tests/test_b.py::test_y")], {}) == [name]


def test_recording_keeps_the_entries_of_mutants_not_run(tmp_path: Path) -> None:
    (tmp_path / "mutation").mkdir()
    first, second = MUTANTS[0].name, MUTANTS[1].name
    (tmp_path / KILLERS).write_text(f'{{"{second}": ["tests/test_old.py::test_z"]}}')
    record_killers(tmp_path, [_killed(first, "tests/test_a.py::test_x")])
    assert load_killers(tmp_path) == {
        first: ["tests/test_a.py::test_x"],
        second: ["tests/test_old.py::test_z"],
    }


def _tiny_copy(tmp_path: Path, test_source: str) -> Path:
    """A copy of a tree as the gate makes one, holding one test file and the gate's plugin."""
    copy = tmp_path / "copy"
    (copy / "tests").mkdir(parents=True)
    (copy / "mutation").symlink_to(ROOT / "mutation", target_is_directory=True)
    (copy / "tests" / "conftest.py").write_text(
        "from hypothesis import settings\nsettings.register_profile('mutation')\n"
    )
    (copy / "tests" / "test_k.py").write_text(test_source)
    return copy


def test_a_kill_is_confirmed_only_when_its_test_passes_without_the_mutant(tmp_path: Path) -> None:
    copy = _tiny_copy(
        tmp_path, "def test_passes():\n    pass\n\ndef test_fails():\n    assert False\n"
    )
    killed = [_killed(MUTANTS[0].name, "tests/test_k.py::test_passes")]
    assert confirm_kills(copy, killed, 30.0, 120.0, [], jobs=1)
    # a test that fails on the unmutated copy too proves nothing about its mutant
    killed.append(_killed(MUTANTS[1].name, "tests/test_k.py::test_fails"))
    assert not confirm_kills(copy, killed, 30.0, 120.0, [], jobs=1)
