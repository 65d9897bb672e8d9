"""`-m real_redis` selects exactly the tests that start a real server: .ci/matrix runs that half of
the suite against every server it claims, so a real-Redis test left unmarked would go untested
on Redis 6.2 and Valkey while the matrix still passed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def collected(marker: str) -> list[str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker,
            "tests",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_the_real_redis_half_is_every_real_backend_and_every_real_redis_user() -> None:
    real = collected("real_redis")
    rest = collected("not real_redis")
    # Through `backend`: its real param only.
    assert any(t.endswith("test_one_cycle_commits[real]") for t in real)
    assert not any("[fakeredis" in t for t in real)
    assert not any("[real" in t for t in rest)
    # Through the `real_redis` fixture, with no mark written in the test module.
    assert "tests/test_verify_cli.py::test_real_redis_run_touches_only_its_own_keys" in real
    assert "tests/test_custody_edges.py::test_take_on_real_redis_is_one_blmove" in real
    # Marked by its module.
    assert (
        "tests/test_end_to_end.py::test_sigkill_mid_run_and_restart_commits_every_task_exactly_once"
    ) in real
    assert not set(real) & set(rest)
