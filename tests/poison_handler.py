"""Handler for the poison-pill end-to-end test (tests/test_poison_pill_e2e.py).

Every execution is recorded outside Redis first: one line (the payload's "n") appended to a file
of this process's own in $TASKCUSTODY_POISON_LOG_DIR, and fsynced, so the line survives the
process dying the next instant. Then an ordinary payload does a little work and returns; the
marked payload ({"poison": true}) kills the process that runs it, alternately by os._exit(1) and
by SIGKILL (chosen from how many times it ran before), so both kinds of death are exercised.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

LOG_DIR = Path(os.environ.get("TASKCUSTODY_POISON_LOG_DIR", "."))
POISON = "poison"

_lock = threading.Lock()
_fd: int | None = None


def _log() -> int:
    # Opened on first use, in the process that runs the handler (one file per pid: no two
    # processes ever append to the same file).
    global _fd
    if _fd is None:
        _fd = os.open(
            LOG_DIR / f"executions-{os.getpid()}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
    return _fd


def executions_before(n: str) -> int:
    """How many executions of payload `n` the log files of every process record so far."""
    return sum(path.read_text().splitlines().count(n) for path in LOG_DIR.glob("executions-*.log"))


def handle(payload: Any) -> None:
    n = str(payload["n"])
    poison = bool(payload.get("poison"))
    with _lock:
        earlier = executions_before(n) if poison else 0
        fd = _log()
        os.write(fd, f"{n}\n".encode())
        os.fsync(fd)
    if poison:
        # Only ever one execution of the pill at a time (one holder), so `earlier` is exact.
        if earlier % 2 == 0:
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)
    # A little work, so that other workers of a process that dies often hold a task too.
    time.sleep(0.002)
