"""Why a handler module did not import, as one line naming the file and line to fix.

`taskcustody worker MODULE:FUNCTION` imports the user's module. Whatever goes wrong there (a
syntax error, an exception raised at import, a dependency that is not installed) is the user's to
fix, so it is reported like every other user error: one line, not a traceback through click and
importlib whose useful frame is buried in the middle. The line names the file and line the user
would open: a SyntaxError's own filename and lineno; for an exception, the innermost frame of the
traceback that lies in the user's files (not in importlib, the standard library, site-packages or
this package).
"""

from __future__ import annotations

import importlib
import os
import site
import sysconfig
import traceback
from functools import cache
from types import TracebackType

import taskcustody

from .errors import one_line


def _dirs(paths: list[str]) -> tuple[str, ...]:
    return tuple(sorted({os.path.realpath(p) for p in paths if p}))


@cache
def _machinery() -> tuple[str, ...]:
    """The import system and the CLI itself: never where a user's error is."""
    return _dirs([os.path.dirname(importlib.__file__), os.path.dirname(taskcustody.__file__ or "")])


@cache
def _installed() -> tuple[str, ...]:
    """The standard library and installed packages: the user's error is rarely there (a library
    raising at import is called from the user's line, which is the one to name)."""
    paths = [
        sysconfig.get_paths().get(name, "")
        for name in ("stdlib", "platstdlib", "purelib", "platlib")
    ]
    # Some virtualenv layouts have no getsitepackages.
    paths += list(getattr(site, "getsitepackages", list)())
    paths.append(site.getusersitepackages())
    return _dirs(paths)


def _inside(filename: str, dirs: tuple[str, ...]) -> bool:
    real = os.path.realpath(filename)
    return any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


def culprit(tb: TracebackType | None) -> traceback.FrameSummary | None:
    """The innermost frame in the user's own files; failing that (a handler module installed in
    site-packages), the innermost outside the import machinery; failing that, the innermost."""
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith("<frozen ")]
    outside_machinery = [f for f in frames if not _inside(f.filename, _machinery())]
    theirs = [f for f in outside_machinery if not _inside(f.filename, _installed())]
    for tier in (theirs, outside_machinery, frames):
        if tier:
            return tier[-1]
    return None


def _exception_text(exc: BaseException) -> str:
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    text = one_line(str(exc))
    return f"{name}: {text}" if text else name


def _is_the_module_itself(module_name: str, exc: Exception) -> bool:
    """The handler module (or a package above it) is not there at all: raised by the import
    system, no frame of any module's code below it."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name is None:
        return False
    named = module_name == exc.name or module_name.startswith(exc.name + ".")
    frames = traceback.extract_tb(exc.__traceback__)
    return named and all(
        f.filename.startswith("<frozen ") or _inside(f.filename, _machinery()) for f in frames
    )


def import_failure(module_name: str, exc: Exception) -> str:
    """The one line that reports `exc`, raised by importing the handler module `module_name`."""
    if _is_the_module_itself(module_name, exc):
        return (
            f"no handler module {module_name!r} ({one_line(str(exc))}): not in the current "
            f"directory {os.getcwd()} nor on the Python path"
        )
    if isinstance(exc, SyntaxError) and exc.filename and not exc.filename.startswith("<"):
        # The file that does not compile may be the handler module or one it imports.
        return (
            f"handler module {module_name!r} does not compile: {exc.filename}:{exc.lineno}: "
            f"{type(exc).__name__}: {one_line(exc.msg or str(exc))}"
        )
    frame = culprit(exc.__traceback__)
    where = "" if frame is None else f"{frame.filename}:{frame.lineno}: "
    inside = "" if frame is None or frame.name == "<module>" else f" (in {frame.name})"
    hint = ""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        hint = (
            f" (module {exc.name!r} is missing where the handler imports it: is it installed "
            "in the environment taskcustody runs in?)"
        )
    return (
        f"handler module {module_name!r} failed at import: {where}{_exception_text(exc)}"
        f"{inside}{hint}"
    )
