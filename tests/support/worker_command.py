"""The `taskcustody worker` command as a subprocess, the way the command-line tests start it: in a
folder the test wrote its handler module into, with this test run's import path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def worker_argv(handler: str, queue: str, redis_url: str, *options: str) -> list[str]:
    """`taskcustody worker HANDLER --queue QUEUE --redis-url URL OPTIONS...` as a subprocess's
    arguments (this interpreter, the package's command module)."""
    return [
        sys.executable,
        "-m",
        "taskcustody.cli",
        "worker",
        handler,
        "--queue",
        queue,
        "--redis-url",
        redis_url,
        *options,
    ]


def worker_env() -> dict[str, str]:
    """The environment with this test run's `sys.path` as PYTHONPATH: the subprocess imports the
    package under test (and, run in the test's folder, the handler module written there)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def write_handler_module(folder: Path, handler: str, source: str) -> None:
    """Write `source` into `folder` as the module that `handler` (MODULE:FUNCTION) names."""
    (folder / f"{handler.partition(':')[0]}.py").write_text(source)


def start_worker(
    folder: Path, handler: str, queue: str, redis_url: str, *options: str
) -> subprocess.Popen[str]:
    """`worker_argv(handler, queue, redis_url, *options)` started in `folder` (where the test
    wrote the handler's module) with `worker_env()`, its stderr a text pipe."""
    return subprocess.Popen(
        worker_argv(handler, queue, redis_url, *options),
        cwd=folder,
        env=worker_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
