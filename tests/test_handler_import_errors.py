"""`taskcustody worker MODULE:FUNCTION` whose module does not import: one line naming the file and
line to fix, exit 2 -- never a traceback through click and importlib.

Each case runs the real command in a subprocess, in a folder holding the handler's module (the
command puts the current directory on the import path), so the import system is the real one. The
handler is loaded before anything connects: the URL names a port nothing listens on."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from tests.support.worker_command import worker_argv, worker_env

NOWHERE = "redis://127.0.0.1:1/0"


def run_worker(folder: Path, handler: str) -> tuple[int, list[str]]:
    """Exit code and the non-blank lines of stdout and stderr together."""
    done = subprocess.run(
        worker_argv(handler, "q", NOWHERE),
        cwd=folder,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return done.returncode, lines


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def one_line_naming(folder: Path, handler: str, *said: str) -> str:
    code, lines = run_worker(folder, handler)
    assert code == 2, lines
    assert len(lines) == 1, "\n".join(lines)
    (line,) = lines
    assert line.startswith("Error: ") and "Traceback" not in line, line
    for part in said:
        assert part in line, line
    return line


def test_a_syntax_error_in_the_handler_module_is_one_line_naming_its_file_and_line(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "tasks.py",
        """\
        def handle(payload):
            return payload +
        """,
    )
    one_line_naming(tmp_path, "tasks:handle", f"{path}:2:", "SyntaxError")


def test_a_syntax_error_in_a_module_the_handler_imports_names_that_module_s_file(
    tmp_path: Path,
) -> None:
    write(
        tmp_path,
        "tasks.py",
        """\
        import helpers

        def handle(payload):
            return helpers.double(payload)
        """,
    )
    broken = write(
        tmp_path,
        "helpers.py",
        """\
        def double(x):
            return x * 2

        def triple(x)
            return x * 3
        """,
    )
    one_line_naming(tmp_path, "tasks:handle", f"{broken}:4:", "SyntaxError")


def test_an_exception_raised_at_import_names_the_innermost_frame_of_the_users_files(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "tasks.py",
        """\
        import os

        def load_config():
            raise RuntimeError("TASKS_CONFIG is not set")

        CONFIG = load_config()

        def handle(payload):
            return payload
        """,
    )
    line = one_line_naming(
        tmp_path, "tasks:handle", f"{path}:4:", "RuntimeError: TASKS_CONFIG is not set"
    )
    assert "in load_config" in line


def test_an_exception_raised_inside_the_standard_library_names_the_users_line_not_its(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "tasks.py",
        """\
        import json

        SETTINGS = json.loads("{not json")

        def handle(payload):
            return payload
        """,
    )
    line = one_line_naming(tmp_path, "tasks:handle", f"{path}:3:", "JSONDecodeError")
    assert "json/decoder.py" not in line


def test_a_missing_dependency_names_the_missing_module_and_where_it_is_imported(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "tasks.py",
        """\
        \"\"\"Resizes images.\"\"\"
        import no_such_dependency_of_theirs

        def handle(payload):
            return payload
        """,
    )
    one_line_naming(
        tmp_path, "tasks:handle", f"{path}:2:", "'no_such_dependency_of_theirs'", "missing"
    )


def test_a_handler_module_that_is_not_there_is_one_line_naming_where_it_was_looked_for(
    tmp_path: Path,
) -> None:
    one_line_naming(
        tmp_path, "no_such_tasks:handle", "no handler module 'no_such_tasks'", str(tmp_path)
    )


def test_a_module_without_the_function_is_one_line_naming_the_modules_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "tasks.py",
        """\
        def handle(payload):
            return payload
        """,
    )
    one_line_naming(tmp_path, "tasks:hadnle", str(path), "no callable 'hadnle'")
