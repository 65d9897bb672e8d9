"""The peers: each in a virtual environment of its own under bench/.venvs/<peer>, created on first
use from the pinned bench/peers/requirements-<peer>.txt (never dependencies of the library)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.harness import BENCH_DIR

VENVS = BENCH_DIR / ".venvs"
PEERS_DIR = BENCH_DIR / "peers"


@dataclass(frozen=True)
class Peer:
    name: str
    label: str
    concurrency: int
    # Which of our concurrency settings is the like-for-like floor for this peer's shape.
    floor: str
    max_tasks: int | None = None  # cap in --quick, for the slowest peers


PEERS = [
    Peer("dramatiq", "dramatiq (Redis broker, 8 worker threads)", 8, "4 threads"),
    Peer("celery", "Celery (Redis transport, solo pool)", 1, "1 worker", max_tasks=1000),
    Peer("rq", "RQ (SimpleWorker)", 1, "1 worker", max_tasks=500),
    Peer("saq", "saq (1 worker, concurrency 10)", 10, "1 worker"),
    Peer("arq", "arq (burst, poll_delay 10 ms)", 10, "1 worker"),
]


def ensure_venv(name: str, requirements: Path, log: Callable[[str], None] = print) -> Path:
    """bench/.venvs/<name> with exactly ``requirements`` installed; returns its python."""
    venv = VENVS / name
    python = venv / "bin" / "python"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    stamp = venv / ".requirements.sha256"
    if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return python
    log(f"  creating {venv.relative_to(BENCH_DIR.parent)} from {requirements.name} (first use)")
    VENVS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
            str(requirements),
        ],
        check=True,
    )
    stamp.write_text(digest + "\n")
    return python


def peer_python(peer: Peer, log: Callable[[str], None] = print) -> Path:
    return ensure_venv(peer.name, PEERS_DIR / f"requirements-{peer.name}.txt", log)


def driver_argv(peer: Peer, python: Path, url: str, tasks: int) -> list[str]:
    return [
        str(python),
        str(PEERS_DIR / f"{peer.name}_driver.py"),
        "--url",
        url,
        "--tasks",
        str(tasks),
        "--concurrency",
        str(peer.concurrency),
    ]
