"""``python -m taskcustody_model.native_build DIR``: the compiled copy of the model that
``native.py`` describes (mypyc over the search modules of a copy of this package)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from .native import STAMP, source_digest

#: the modules the search spends its time in (the rest stays interpreted)
COMPILED = (
    "state",
    "variants",
    "action",
    "custody",
    "selection",
    "worker_steps",
    "server_steps",
    "environment",
    "faults",
    "protocol",
    "invariants",
    "symmetry",
    "graph",
    "reduction",
    "checker",
    "parallel",
)


def build(out: Path) -> Path:
    """Copy this package into ``out`` and compile ``COMPILED`` there; returns the package dir."""
    here = Path(__file__).resolve().parent
    target = out / "taskcustody_model"
    if target.exists():
        shutil.rmtree(target)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(here, target, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    subprocess.run(
        [sys.executable, "-m", "mypyc", *(f"taskcustody_model/{m}.py" for m in COMPILED)],
        cwd=out,
        check=True,
        capture_output=True,
    )
    (target / STAMP).write_text(json.dumps({"source": str(here), "digest": source_digest(here)}))
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m taskcustody_model.native_build DIR", file=sys.stderr)
        return 2
    try:
        target = build(Path(args[0]).resolve())
    except subprocess.CalledProcessError as exc:
        out = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(
            errors="replace"
        )
        print(f"mypyc failed:\n{out.strip()}", file=sys.stderr)
        return 1
    print(f"compiled model in {target} (put {target.parent} first on PYTHONPATH)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
