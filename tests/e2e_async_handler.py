"""async def handler for the asyncio end-to-end test: counts executions per task id in Redis
(awaited), then awaits a little, so a SIGKILL often lands between execution and release."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis.asyncio

_client = redis.asyncio.Redis.from_url(
    os.environ.get("TASKCUSTODY_E2E_URL", "redis://127.0.0.1:6379/0")
)


async def handle(payload: Any) -> None:
    await _client.hincrby("e2e:executions", str(payload["n"]), 1)
    await asyncio.sleep(0.002)
