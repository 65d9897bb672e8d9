"""Which tests the named-mutant gate may leave out: only those no named mutant can reach."""

from __future__ import annotations

from pathlib import Path

from mutation.gate import DESIGNS_TABLE, PRESENTATION_TESTS, independent_of_core

ROOT = Path(__file__).resolve().parent.parent


def _tree(tmp_path: Path, test_source: str, table_source: str) -> Path:
    (tmp_path / "tests" / "model").mkdir(parents=True)
    (tmp_path / "tests" / "model" / "test_x.py").write_text(test_source)
    table = tmp_path / DESIGNS_TABLE
    table.parent.mkdir(parents=True)
    table.write_text(table_source)
    return tmp_path


def test_the_model_tests_are_independent_of_the_core_in_this_tree() -> None:
    assert independent_of_core(ROOT, ["model", "tests/model"])


def test_reading_the_designs_table_keeps_a_folder_independent(tmp_path: Path) -> None:
    tree = _tree(
        tmp_path,
        "from taskcustody.verify.designs import DESIGNS\n",
        "from taskcustody_model import Bounds\n",
    )
    assert independent_of_core(tree, ["tests/model"])


def test_importing_the_core_makes_a_folder_dependent(tmp_path: Path) -> None:
    tree = _tree(
        tmp_path,
        "from taskcustody.core.worker import Worker\n",
        "from taskcustody_model import Bounds\n",
    )
    assert not independent_of_core(tree, ["tests/model"])


def test_a_designs_table_that_imports_the_core_makes_its_readers_dependent(tmp_path: Path) -> None:
    tree = _tree(
        tmp_path,
        "from taskcustody.verify.designs import DESIGNS\n",
        "from taskcustody.core import scripts\n",
    )
    assert not independent_of_core(tree, ["tests/model"])


def test_every_test_file_the_gate_leaves_out_exists() -> None:
    for path in PRESENTATION_TESTS:
        assert (ROOT / path).is_file(), path
