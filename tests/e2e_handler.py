"""Handler for the end-to-end test: counts executions per task id in Redis, then returns."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

_client = redis.Redis.from_url(os.environ.get("TASKCUSTODY_E2E_URL", "redis://127.0.0.1:6379/0"))


def handle(payload: Any) -> None:
    _client.hincrby("e2e:executions", str(payload["n"]), 1)
    # A little work after counting, so a SIGKILL often lands between execution and release.
    time.sleep(0.002)
