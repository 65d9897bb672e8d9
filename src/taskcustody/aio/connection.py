"""asyncio clients configured like the threaded API's (`taskcustody.connect`): the same timeouts,
no transport retries (a blind retry of a BLMOVE takes a second task), raw bytes."""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..core.settings import Settings
from ..deploy.connection import is_fakeredis
from ..deploy.redis_options import no_maint_notifications


def no_retry() -> Retry:
    """The asyncio twin of `taskcustody.deploy.connection.no_retry`: retries belong to the
    protocol."""
    return Retry(NoBackoff(), 0)


def connect_async(url: str, settings: Settings | None = None) -> redis.asyncio.Redis:
    """An asyncio client for `url` (a single Redis or Valkey; Redis Cluster is not served by the
    asyncio API yet)."""
    settings = settings or Settings()
    client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(
        url,
        socket_timeout=settings.socket_timeout,
        socket_connect_timeout=settings.socket_timeout,
        retry=no_retry(),
        decode_responses=False,
        # Maintenance notifications off, as for the threaded API's clients (redis_options.py).
        **no_maint_notifications(redis.asyncio.ConnectionPool),
    )
    return client


def connect_fake_async(server: Any = None) -> redis.asyncio.Redis:
    """An in-process fakeredis asyncio client; give it the `fakeredis.FakeServer` of a
    threaded client (`taskcustody.connect_fake`) to share one keyspace with it."""
    import fakeredis
    import fakeredis.aioredis

    fake_server = server if server is not None else fakeredis.FakeServer()
    client: redis.asyncio.Redis = fakeredis.aioredis.FakeRedis(server=fake_server, retry=no_retry())
    return client


def is_fake(client: redis.asyncio.Redis) -> bool:
    return is_fakeredis(cast(redis.Redis, client))


def own_connection(client: redis.asyncio.Redis) -> redis.asyncio.Connection:
    """A connection of a worker's own, outside the pool (held for the worker's whole life),
    built like the pool's: the same timeouts, retries off."""
    pool = client.connection_pool
    return cast(redis.asyncio.Connection, pool.connection_class(**pool.connection_kwargs))


def refuse_unsupported(client: redis.asyncio.Redis, settings: Settings) -> None:
    """What the asyncio API does not serve yet, refused at once rather than half-served."""
    if settings.min_replicas:
        raise ValueError(
            "min_replicas is not supported by the asyncio API yet: use the "
            "threaded API (taskcustody.Server) for WAIT after writes"
        )
    if isinstance(client, redis.asyncio.RedisCluster):  # pragma: no cover - refused by type
        raise ValueError("Redis Cluster is not supported by the asyncio API yet")
