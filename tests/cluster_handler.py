"""Handler for the cluster end-to-end test: counts executions per task in the queue's own slot
(`e2e:{<queue>}:executions`), through a cluster client seeded by $TASKCUSTODY_CLUSTER_URL."""

from __future__ import annotations

import os
import time
from typing import Any

from redis.cluster import RedisCluster

_client: RedisCluster | None = None


def _cluster() -> RedisCluster:
    global _client
    if _client is None:
        # No default URL: this handler must never reach a Redis the test did not start.
        _client = RedisCluster.from_url(os.environ["TASKCUSTODY_CLUSTER_URL"])
    return _client


def handle(payload: Any) -> None:
    _cluster().hincrby(f"e2e:{{{payload['q']}}}:executions", str(payload["n"]), 1)
    time.sleep(0.02)  # some work, so that events land while tasks are in flight
