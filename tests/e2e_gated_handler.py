"""Handler for the Redis-restart end-to-end tests: it logs each execution to a file of its own
process (outside Redis, so a Redis restart cannot hide an execution) and holds the task until the
test opens its gate.

Environment: TASKCUSTODY_E2E_LOG, this process's append-only log ("start N" / "done N" lines);
TASKCUSTODY_E2E_GATES, a directory where the file `N` (or `all`) lets task N finish.
"""

from __future__ import annotations

import os
import time
from typing import Any

_LOG = os.environ.get("TASKCUSTODY_E2E_LOG", "")
_GATES = os.environ.get("TASKCUSTODY_E2E_GATES", "")


def _append(line: str) -> None:
    # One write() on an O_APPEND descriptor: the line is in the kernel before the handler goes on,
    # so a SIGKILL right after cannot lose it, and concurrent writers never interleave.
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def gate_open(n: int) -> bool:
    return any(os.path.exists(os.path.join(_GATES, name)) for name in (str(n), "all"))


def handle(payload: Any) -> None:
    n = int(payload["n"])
    _append(f"start {n}")
    # Held until the test says so: the test decides what is running when it kills a process or
    # restarts Redis, instead of hoping a sleep is long enough.
    while not gate_open(n):
        time.sleep(0.02)
    _append(f"done {n}")
