"""Redis clients configured for the protocol, and the server checks done before any work."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError
from redis.retry import Retry

from ..core.errors import RedisTooOld, WrongKeyType
from ..core.keys import QueueKeys
from ..core.settings import Settings
from ..ops.logs import remember_url
from .cluster import cluster_client, is_cluster, is_cluster_node, node_client, route
from .eviction import check_eviction_policy
from .redis_errors import is_unknown_command, reachable, refuse_replica
from .redis_options import no_maint_notifications

MIN_VERSION = (6, 2, 0)


def no_retry() -> Retry:
    """Retries belong to the protocol, not the transport.

    redis-py 8 retries a command up to 10 times on ConnectionError/TimeoutError by default. A blind
    retry of BLMOVE after a lost reply takes a *second* task while the first sits unseen in the
    worker's in-flight list. So our clients never retry; the worker knows which of its steps are
    safe to repeat and reconciles its list instead.
    """
    return Retry(NoBackoff(), 0)


def connect(url: str, settings: Settings | None = None, cluster: bool | None = None) -> redis.Redis:
    """A client for `url`. A Redis Cluster node (`cluster_enabled:1`, asked with `INFO cluster`)
    gets a cluster client seeded by it (any node works, a replica too); `cluster` True/False
    overrides the detection. Retries are off either way (`no_retry`); a cluster client still
    follows MOVED and ASK, which Redis answers without running the command."""
    settings = settings or Settings()
    options: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
        "retry": no_retry(),
        "decode_responses": False,
    }
    # Without redis-py 8's maintenance notifications (redis_options.py): a Redis 7 refuses them
    # on every new connection, and redis-py logs each refusal. (The cluster client is told the
    # same by `cluster_client`, in its own terms.)
    plain = {**options, **no_maint_notifications(redis.ConnectionPool)}
    if cluster is None:
        probe = redis.Redis.from_url(url, **plain)
        try:
            cluster = is_cluster_node(probe)
        except redis.RedisError:
            # Unreachable now, or not a Redis we can ask (an HTTP port, a refused password, a
            # refused HELLO): a plain client, whose first command reports it by name (as before).
            cluster = False
        finally:
            probe.close()
    if cluster:
        try:
            client = cluster_client(url, **options)
        except (redis.RedisError, redis.exceptions.RedisClusterException):
            raise
        except Exception as exc:  # redis-py 5 fails on a cluster that serves no slot (IndexError)
            raise redis.exceptions.RedisClusterException(
                f"the Redis Cluster at {url} cannot be used: {exc!r}"
            ) from exc
    else:
        client = redis.Redis.from_url(url, **plain)
    # The start banner names the URL the user gave (logs.client_url), not a node the client picked.
    remember_url(client, url)
    return client


def connect_fake(server: Any = None) -> redis.Redis:
    """An in-process fakeredis client (the embedded default of `taskcustody verify`)."""
    import fakeredis

    fake_server = server if server is not None else fakeredis.FakeServer()
    client: redis.Redis = fakeredis.FakeRedis(server=fake_server, retry=no_retry())
    return client


def is_fakeredis(client: redis.Redis) -> bool:
    pool = getattr(client, "connection_pool", None)  # a RedisCluster has one pool per node
    if pool is None:
        return False
    module: str = pool.connection_class.__module__
    return module.startswith("fakeredis")


def parse_version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    # "6.2" is 6.2.0: compared with MIN_VERSION, a shorter tuple would rank below it.
    return tuple(parts + [0] * (3 - len(parts)))


def _refused_hello(exc: redis.ResponseError) -> bool:
    """A server older than 6.0 has no HELLO, which redis-py 8 sends (`HELLO 3`) on connecting."""
    return "hello" in str(exc).lower()


def _info_over_resp2(client: redis.Redis) -> dict[str, Any]:
    """INFO on a RESP2 connection like the client's own, for a server that refused HELLO: its
    version is what the refusal must name, not the HELLO error."""
    pool = client.connection_pool
    # Same address, credentials and timeouts; not redis-py 8's maintenance notifications, which
    # it refuses on a RESP2 connection: any the client's pool carries are left out, and the
    # probe's pool is told to have none, as `connect` tells every client (redis_options.py).
    kwargs = {
        key: value
        for key, value in pool.connection_kwargs.items()
        if not key.startswith("maint_notifications")
    }
    kwargs["protocol"] = 2
    probe = redis.Redis(
        connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class,
            **kwargs,
            **no_maint_notifications(redis.ConnectionPool),
        )
    )
    try:
        info: dict[str, Any] = probe.info("server")
        return info
    finally:
        probe.close()
        probe.connection_pool.disconnect()


def server_version(client: redis.Redis) -> str:
    try:
        info = client.info("server")
    except redis.ResponseError as refused:
        if _refused_hello(refused):
            return str(_info_over_resp2(client).get("redis_version", "unknown"))
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


def check_version(client: redis.Redis) -> str:
    """The server's version; RedisTooOld, naming it, if the server is older than 6.2."""
    version = server_version(client)
    if not version.startswith("unknown") and parse_version(version) < MIN_VERSION:
        raise RedisTooOld(
            f"Redis {version} found; taskcustody needs Redis 6.2 or newer for BLMOVE and LMOVE"
        )
    return version


def check_server(
    client: redis.Redis, keys: QueueKeys, *, allow_evicting_policy: bool = False
) -> str:
    """Refuse to work against a server or a keyspace that would break the protocol: Redis < 6.2,
    a replica, an eviction policy that may delete our keys (unless allowed), keys of the wrong
    type. A URL that reaches no Redis database is named first (redis_errors.reachable). On a
    cluster the version, the role and the policy are those of the master that owns the queue's
    slot."""
    reachable(client)
    node = node_client(client, keys.queue)
    version = check_version(node)
    refuse_replica(node)
    if not is_fakeredis(node):  # an in-process fake evicts nothing
        check_eviction_policy(node, allow_evicting_policy=allow_evicting_policy)
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
            where = f" ({route(client, key)})" if is_cluster(client) else ""
            raise WrongKeyType(
                f"key {key!r}{where} holds a {kind}, but taskcustody needs a {want} there"
            )
