"""Driver side of the benchmark handshake (see bench/harness.py). Standalone: runs in each peer's
own virtual environment, with whatever redis-py that peer pins."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

import redis


def parse_args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--url", required=True)
    ap.add_argument("--tasks", type=int, required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument(
        "--wait-ms",
        type=float,
        default=0.0,
        help="async handlers (saq, arq): await asyncio.sleep this long first",
    )
    return ap.parse_args()


def emit(msg: dict[str, Any]) -> None:
    out = sys.__stdout__ or sys.stdout  # Celery swaps sys.stdout for a logging proxy
    out.write(json.dumps(msg) + "\n")
    out.flush()


def wait_for_go(**info: Any) -> None:
    emit({"event": "enqueued", **info})
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit("harness went away")


def snapshot(client: redis.Redis) -> dict[str, Any]:
    info = client.info("all")
    commands: dict[str, int] = {}
    for key, value in info.items():
        if key.startswith("cmdstat_"):
            if isinstance(value, dict):
                commands[key[8:]] = int(value.get("calls", 0))
            else:
                parts = dict(p.split("=", 1) for p in str(value).split(","))
                commands[key[8:]] = int(parts.get("calls", 0))
    return {"commands": commands, "reads": int(info.get("total_reads_processed", 0))}


class Finish:
    """Counts completions; the one that completes the last task stamps the time and snapshots the
    server's counters on a connection opened before the clock started."""

    def __init__(self, url: str, tasks: int) -> None:
        self.tasks = tasks
        self.count = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.stats_client = redis.Redis.from_url(url)
        self.stats_client.ping()
        self.start = 0.0
        self.end = 0.0
        self.info: dict[str, Any] | None = None

    def begin(self) -> None:
        self.start = time.monotonic()

    def tick(self) -> None:
        with self.lock:
            self.count += 1
            last = self.count == self.tasks
        if last:
            self.end = time.monotonic()
            self.info = snapshot(self.stats_client)
            self.done.set()

    def report(self, **extra: Any) -> None:
        emit(
            {
                "event": "done",
                "tasks": self.count,
                "seconds": self.end - self.start,
                "info": self.info,
                **extra,
            }
        )

    def exit_when_done(self) -> None:
        """In the background: once the last task completes, report and end the process at once
        (the peers' workers have no clean "stop after N tasks")."""

        def watch() -> None:
            self.done.wait()
            self.report()
            os._exit(0)

        threading.Thread(target=watch, daemon=True).start()
