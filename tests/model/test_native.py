"""The compiled copy of the model (``taskcustody_model.native_build``, mypyc) is the model: every
design gives the same verdict, counterexample length, states, transitions and depth compiled as
interpreted; and a copy built from sources that have changed since refuses to import."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from taskcustody_model import Bounds
from taskcustody_model.native import STAMP, StaleNativeModel, check_fresh, source_digest
from taskcustody_model.variants import VARIANTS

from .searches import check

SMALL = Bounds(tasks=2, servers=2, workers=1, faults=2, processes_per_server=2)

_FIGURES = """
import json, sys
import taskcustody_model.symmetry as symmetry
from taskcustody_model import Bounds, check
bounds = Bounds(**json.loads(sys.argv[1]))
rows = {}
for name in json.loads(sys.argv[2]):
    r = check(bounds, name)
    rows[name] = [r.ok, r.property, r.violation and len(r.violation), r.distinct_states,
                  r.states_generated, r.depth]
print(json.dumps({"compiled": symmetry.__file__.endswith(".so"), "rows": rows}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="mypyc needs a C compiler"
)
def test_the_compiled_model_explores_exactly_the_interpreted_model_s_states(tmp_path: Path) -> None:
    from taskcustody_model.native_build import build

    build(tmp_path)
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{src}"}
    out = subprocess.run(
        [sys.executable, "-c", _FIGURES, json.dumps(SMALL._asdict()), json.dumps(list(VARIANTS))],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    got = json.loads(out.stdout)
    assert got["compiled"]
    for name in VARIANTS:
        r = check(SMALL, name)
        want = [
            r.ok,
            r.property,
            r.violation and len(r.violation),
            r.distinct_states,
            r.states_generated,
            r.depth,
        ]
        assert got["rows"][name] == want, name


def test_a_compiled_copy_of_changed_sources_refuses_to_import(tmp_path: Path) -> None:
    source = tmp_path / "source"
    copy = tmp_path / "copy"
    for d in (source, copy):
        d.mkdir()
        (d / "state.py").write_text("X = 1\n")
    (copy / STAMP).write_text(json.dumps({"source": str(source), "digest": source_digest(source)}))
    check_fresh(copy)  # fresh: nothing raised
    (source / "state.py").write_text("X = 2\n")
    with pytest.raises(StaleNativeModel, match="has changed since"):
        check_fresh(copy)


def test_the_sources_themselves_are_always_fresh(tmp_path: Path) -> None:
    (tmp_path / "state.py").write_text("X = 1\n")
    check_fresh(tmp_path)
