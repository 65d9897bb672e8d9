"""The repository stands on its own: its spec of record is docs/protocol.md, and no tracked file
points at documents outside the repository (a reader of a clone has nothing else)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from taskcustody_model.variants import VARIANTS

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "protocol.md"
THIS = Path(__file__).resolve()

#: How references to the old design folder outside the repository were written. Built from
#: parts, so that this file does not itself contain the references it looks for.
_SHARED = "sha" + "red"
OUTSIDE = (f"../{_SHARED}", f"{_SHARED}/design", f"{_SHARED}/reference")

# The mutation gate runs the suite in a copy of src/, model/, tests/ (no .git, no docs/): there is
# no repository to check. In a checkout (CI's clean clone, a worktree) these tests always run.
pytestmark = pytest.mark.skipif(
    not (ROOT / ".git").exists(), reason="not a git checkout (e.g. the mutation gate's copy)"
)


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], check=True, capture_output=True
    ).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def outside_references(text: str) -> list[str]:
    """The lines of `text` that mention a location outside the repository."""
    return [line.strip() for line in text.splitlines() if any(p in line for p in OUTSIDE)]


def test_the_outside_reference_finder_sees_each_spelling() -> None:
    # Guards the test below against a pattern list that matches nothing.
    for spelling in (
        f"see ../{_SHARED}/design/protocol.md",
        f"{_SHARED}/reference/pr.md",
        f"{_SHARED}/design",
    ):
        assert outside_references(f"x\n{spelling}\n") == [spelling]
    assert outside_references("a shared machine; docs/protocol.md") == []


def test_no_tracked_file_refers_to_files_outside_the_repository() -> None:
    files = tracked_files()
    assert ROOT / "docs" / "protocol.md" in files, "docs/protocol.md must be tracked"
    found = []
    for path in files:
        if path.resolve() == THIS or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary (images)
            continue
        for line in outside_references(data.decode("utf-8", errors="replace")):
            found.append(f"{path.relative_to(ROOT)}: {line}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "correct"])
def test_every_broken_design_has_its_numbered_section_in_the_protocol(name: str) -> None:
    """Code and docs cite designs by number ("design 6 of docs/protocol.md"); the number comes from
    the variant's description, so the heading must carry the same number and the variant's name."""
    number = VARIANTS[name].description.split(".", 1)[0]
    assert number.isdigit(), VARIANTS[name].description
    heading = re.compile(rf"^###\s+{number}\.\s+`{re.escape(name)}`", re.MULTILINE)
    assert heading.search(PROTOCOL.read_text()), (
        f"docs/protocol.md has no heading '### {number}. `{name}`'"
    )
