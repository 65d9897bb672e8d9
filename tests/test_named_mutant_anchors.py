"""Every named mutant still hits the code: each anchor, and each line an equivalence review rests
on, occurs exactly once in today's tree, and the mutated file still compiles.

The mutation gate checks the same at its start, but it runs last in CI, after the whole suite; a
refactor that moves a protocol line should fail here, in the suite the developer runs, with the
mutant's name. The gate's suite runs and mutmut's leave this file out: under a mutant it fails by
construction, which would pass for a kill."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mutation.gate import Stale, apply_edits
from mutation.named import MUTANTS, NamedMutant

ROOT = Path(__file__).resolve().parents[1]


def read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_named_mutant_anchors_occur_exactly_once(mutant: NamedMutant) -> None:
    try:
        texts = apply_edits(mutant, read)
    except Stale as stale:
        pytest.fail(f"stale named mutant: {stale}")
    for path, text in texts.items():
        assert text != read(path), f"{mutant.name} changes nothing in {path}"
        # Python here; the Lua in a process of its own (below): a second Lua runtime in the
        # process that fakeredis loaded one into segfaults.
        if path.endswith(".py"):
            compile(text, path, "exec")


LUA_MUTANTS = [m for m in MUTANTS if any(e.path.endswith(".lua") for e in m.edits)]


def test_every_lua_mutant_compiles_as_redis_is_sent_it(tmp_path: Path) -> None:
    """What the gate checks before it runs a mutant of the Lua (`check_syntax`, then
    `check_scripts` on the copy): the mutated file loads on its own, and every script, composed
    with its fragments, still compiles. Each mutant goes into a copy of the scripts' module and
    its lua/ directory, checked in a process of its own."""
    assert len(LUA_MUTANTS) >= 14
    package = ROOT / "src/taskcustody/core"
    copies = []
    for mutant in LUA_MUTANTS:
        copy = tmp_path / mutant.name
        (copy / "src/taskcustody/core").mkdir(parents=True)
        shutil.copy(package / "scripts.py", copy / "src/taskcustody/core/scripts.py")
        shutil.copytree(package / "lua", copy / "src/taskcustody/core/lua")
        for path, text in apply_edits(mutant, read).items():
            (copy / path).write_text(text, encoding="utf-8")
        copies.append(str(copy))
    code = textwrap.dedent("""
        import sys
        from pathlib import Path
        from mutation.gate import check_scripts, check_syntax
        for copy in sys.argv[1:]:
            for lua in sorted(Path(copy).rglob("*.lua")):
                check_syntax(str(lua), lua.read_text(encoding="utf-8"))
            check_scripts(Path(copy) / "src/taskcustody/core/scripts.py")
        print("checked", len(sys.argv) - 1)
    """)
    done = subprocess.run(
        [sys.executable, "-c", code, *copies],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["checked", str(len(copies))]


def test_a_stale_anchor_is_reported() -> None:
    """The check above can fail: an anchor that is not in the tree raises Stale."""
    from mutation.named import Edit

    ghost = NamedMutant(
        "ghost", "nothing", (Edit("src/taskcustody/core/worker.py", "no such line\n", "x\n"),)
    )
    with pytest.raises(Stale):
        apply_edits(ghost, read)


def test_the_recovered_to_queue_demonstration_still_rewrites_the_real_scripts() -> None:
    """Design 12's demonstration (verify/broken.py) is the real DRAIN_CHUNK and REQUEUE_STUCK
    with one line each replaced: if a replacement no longer finds its line, the demonstration
    silently becomes the correct design."""
    from taskcustody.core import scripts
    from taskcustody.verify import broken

    assert broken._DRAIN_TO_QUEUE != scripts.DRAIN_CHUNK
    assert broken._REQUEUE_TO_QUEUE != scripts.REQUEUE_STUCK
