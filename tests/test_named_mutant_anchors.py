"""Every named mutant still hits the code: each anchor, and each line an equivalence review rests
on, occurs exactly once in today's tree, and the mutated file still compiles.

The mutation gate checks the same at its start, but it runs last in CI, after the whole suite; a
refactor that moves a protocol line should fail here, in the suite the developer runs, with the
mutant's name. The gate's suite runs and mutmut's leave this file out: under a mutant it fails by
construction, which would pass for a kill."""

from __future__ import annotations

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
        # Python only: the gate also loads scripts.py's Lua with lupa, which cannot be done here
        # (a second Lua runtime in the process that fakeredis loaded one into segfaults).
        compile(text, path, "exec")


def test_a_stale_anchor_is_reported() -> None:
    """The check above can fail: an anchor that is not in the tree raises Stale."""
    from mutation.named import Edit

    ghost = NamedMutant("ghost", "nothing", (Edit("src/taskcustody/core/worker.py",
                                                   "no such line\n", "x\n"),))
    with pytest.raises(Stale):
        apply_edits(ghost, read)


def test_the_recovered_to_queue_demonstration_still_rewrites_the_real_scripts() -> None:
    """Design 12's demonstration (verify/broken.py) is the real DRAIN_CHUNK and REQUEUE_STUCK
    with one line each replaced: if a replacement no longer finds its line, the demonstration
    silently becomes the correct design."""
    from taskcustody import scripts
    from taskcustody.verify import broken

    assert broken._DRAIN_TO_QUEUE != scripts.DRAIN_CHUNK
    assert broken._REQUEUE_TO_QUEUE != scripts.REQUEUE_STUCK
