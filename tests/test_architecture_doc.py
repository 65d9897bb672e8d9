"""docs/architecture.md stays the map of src/taskcustody: every module outside verify/ is on it,
every file it names exists, and no module of the package or the model grows past 600 lines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "taskcustody"
DOC = ROOT / "docs" / "architecture.md"
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if "verify" not in path.relative_to(PACKAGE).parts
        and "aio" not in path.relative_to(PACKAGE).parts
    )


def _tree() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index("```text") : text.index("```", text.index("```text") + 3)]


def test_every_module_is_on_the_map() -> None:
    """Each module of core/, deploy/, ops/ and cli/ (and the package's own files) appears in the
    tree under its own folder; aio/ and verify/ are described as folders."""
    tree = _tree()
    folder = ""
    on_map: set[str] = set()
    for line in tree.splitlines()[2:]:
        name = re.sub(r"^[│├└─\s]+", "", line).split(" ", 1)[0]
        depth = (len(line) - len(line.lstrip("│├└─ "))) // 4
        if name.endswith("/"):
            folder = name
        elif name.endswith(".py"):
            on_map.add((folder if depth > 1 else "") + name)
    wanted = {
        str(path.relative_to(PACKAGE)).replace("\\", "/")
        for path in _modules()
        if path.name != "__init__.py" or path.parent == PACKAGE
    }
    assert wanted - on_map == set(), "modules missing from docs/architecture.md"
    assert on_map - wanted == set(), "docs/architecture.md names modules that do not exist"


def test_the_walk_through_names_files_that_exist() -> None:
    text = DOC.read_text(encoding="utf-8")
    walk = text[text.index("## One task from enqueue to commit") :]
    named = set(re.findall(r"`((?:core|deploy|ops|cli)/\w+\.py)`", walk))
    assert named, "the walk-through names no file"
    for path in named:
        assert (PACKAGE / path).is_file(), path


def test_no_module_of_the_package_or_the_model_is_over_600_lines() -> None:
    """A module past 600 lines does more than one job; split it (the model included)."""
    model = ROOT / "model" / "taskcustody_model"
    long = {
        str(path.relative_to(ROOT)): n
        for folder in (PACKAGE, model)
        for path in folder.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
