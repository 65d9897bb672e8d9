"""Redis clients configured for the protocol, and the server checks done before any work."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError
from redis.retry import Retry

from .errors import RedisTooOld, WrongKeyType
from .eviction import check_eviction_policy
from .keys import QueueKeys
from .redis_errors import is_unknown_command, reachable, refuse_replica
from .settings import Settings

MIN_VERSION = (6, 2, 0)


def no_retry() -> Retry:
    """Retries belong to the protocol, not the transport.

    redis-py 8 retries a command up to 10 times on ConnectionError/TimeoutError by default. A blind
    retry of BLMOVE after a lost reply takes a *second* task while the first sits unseen in the
    worker's in-flight list. So our clients never retry; the worker knows which of its steps are
    safe to repeat and reconciles its list instead.
    """
    return Retry(NoBackoff(), 0)


def connect(url: str, settings: Settings | None = None) -> redis.Redis:
    settings = settings or Settings()
    return redis.Redis.from_url(
        url,
        socket_timeout=settings.socket_timeout,
        socket_connect_timeout=settings.socket_timeout,
        retry=no_retry(),
        decode_responses=False,
    )


def connect_fake(server: Any = None) -> redis.Redis:
    """An in-process fakeredis client (the embedded default of `taskcustody verify`)."""
    import fakeredis

    fake_server = server if server is not None else fakeredis.FakeServer()
    client: redis.Redis = fakeredis.FakeRedis(server=fake_server, retry=no_retry())
    return client


def is_fakeredis(client: redis.Redis) -> bool:
    module: str = client.connection_pool.connection_class.__module__
    return module.startswith("fakeredis")


def parse_version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    # "6.2" is 6.2.0: compared with MIN_VERSION, a shorter tuple would rank below it.
    return tuple(parts + [0] * (3 - len(parts)))


def server_version(client: redis.Redis) -> str:
    try:
        info = client.info("server")
    except redis.ResponseError as refused:
        # fakeredis does not implement INFO; probe the commands we need instead. Only then, and
        # when INFO is unknown (renamed) or forbidden (ACL): any other refusal (a database index
        # out of range, say) says nothing about the version.
        if not (is_unknown_command(refused) or isinstance(refused, NoPermissionError)):
            raise
        try:
            probe = "__taskcustody_probe__"
            client.lmove(probe, probe, "RIGHT", "LEFT")
        except redis.ResponseError as exc:
            if not is_unknown_command(exc):
                raise
            raise RedisTooOld(f"this server has no LMOVE (Redis < 6.2?): {exc}") from exc
        return "unknown (no INFO; LMOVE present)"
    return str(info.get("redis_version", "unknown"))


def check_server(client: redis.Redis, keys: QueueKeys, *,
                 allow_evicting_policy: bool = False) -> str:
    """Refuse to work against a server or a keyspace that would break the protocol: Redis < 6.2,
    an eviction policy that may delete our keys (unless allowed), keys of the wrong type. A URL
    that reaches no Redis database is named first (redis_errors.reachable)."""
    reachable(client)
    version = server_version(client)
    if not version.startswith("unknown") and parse_version(version) < MIN_VERSION:
        raise RedisTooOld(
            f"Redis {version} found; taskcustody needs Redis 6.2 or newer for BLMOVE and LMOVE"
        )
    refuse_replica(client)
    if not is_fakeredis(client):  # an in-process fake evicts nothing
        check_eviction_policy(client, allow_evicting_policy=allow_evicting_policy)
    check_key_types(client, keys)
    return version


def check_key_types(client: redis.Redis, keys: QueueKeys) -> None:
    pipe = client.pipeline(transaction=False)
    expected = keys.all_fixed_keys()
    for key in expected:
        pipe.type(key)
    for (key, want), got in zip(expected.items(), pipe.execute(), strict=True):
        kind = got.decode() if isinstance(got, bytes) else str(got)
        if kind not in ("none", want):
            raise WrongKeyType(f"key {key!r} holds a {kind}, but taskcustody needs a {want} there")
