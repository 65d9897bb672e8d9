"""Completion records of the audit, kept outside Redis: one append-only file per worker process
($AUDIT_RECORD_DIR/records.<pid>), one line per event "<start|done> <task> <pid> <unix time>".
O_APPEND and a single write(2) per line: a SIGKILL of the process after the write cannot undo it
(the data is in the kernel), and no Redis fault can hide it. Standalone: imported by every peer's
audit app in that peer's venv."""

from __future__ import annotations

import os
import time

TASK_SECONDS = float(os.environ.get("AUDIT_TASK_SECONDS", "0.2"))


def record(kind: str, task: str) -> None:
    pid = os.getpid()
    line = f"{kind} {task} {pid} {time.time():.6f}\n".encode()
    path = os.path.join(os.environ["AUDIT_RECORD_DIR"], f"records.{pid}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def task_name(i: int) -> str:
    """The token a task carries in its arguments; the harness finds it in a dropped reply."""
    return f"tk-{i:06d}"
