"""A compiled copy of the model, generated from it with mypyc: the same spec, run faster.

``python -m taskcustody_model.native_build DIR`` copies this package to
``DIR/taskcustody_model`` and compiles its search modules there (mypyc, which comes with mypy; a
C compiler is needed).  Put ``DIR`` first on ``PYTHONPATH`` and ``taskcustody model-check`` (or
``check``) runs compiled.

Nothing is written by hand: the compiled modules are these very sources, so the state space, the
transitions and the verdicts are the model's (``tests/model/test_native.py`` runs every design
both ways at small bounds and asserts the same figures).  The copy records a digest of the
sources it was built from, and refuses to import (``StaleNativeModel``) once they have changed
here, so a stale build can never check an older model unnoticed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

STAMP = "NATIVE_SOURCE.json"


class StaleNativeModel(ImportError):
    """The compiled copy was built from sources that have changed since."""


def source_digest(package: Path) -> str:
    """A digest of the package's Python sources (names and contents)."""
    h = hashlib.sha256()
    for path in sorted(package.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def check_fresh(package: Path) -> None:
    """Raise ``StaleNativeModel`` if ``package`` is a compiled copy of sources since changed."""
    stamp = package / STAMP
    if not stamp.exists():
        return  # the sources themselves
    built = json.loads(stamp.read_text())
    source = Path(built["source"])
    if source.is_dir() and source_digest(source) != built["digest"]:
        raise StaleNativeModel(
            f"{package} was compiled from {source}, which has changed since: run "
            f"`python -m taskcustody_model.native_build {package.parent}` again"
        )
