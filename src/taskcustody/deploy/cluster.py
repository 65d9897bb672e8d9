"""Redis Cluster: detecting a cluster node, routing to the node that owns a queue's slot, and
naming what a redirect means.

Every key of a queue shares one hash tag (core/keys.py), so a queue lives in one slot, on one
master: every script and pipeline we send stays on that node. What this module adds is the client
side:

* `connect` (connection.py) asks the node (`INFO cluster`) and builds a `RedisCluster` for a
  cluster node. Any node works as the seed, a replica included: the client reads the slot map.
* A worker's own connection (`own_connection`) goes to the master that owns its queue's slot,
  resolved through the cluster client's slot map, outside any pool, with retries off.
* Redirects: a node that does not serve the slot (any more) answers MOVED; after a failover, a
  BLMOVE blocked on the old master is answered `-UNBLOCKED` (Redis 7.0.15, pinned in
  tests/test_cluster_redirects.py). During a live migration a node answers ASK (the key has
  moved to the importing node) or TRYAGAIN (a multi-key command whose keys are split between
  the two nodes). In every case Redis did NOT run the command, so the step can be sent again:
  `redirect_kind` tells which.
"""

from __future__ import annotations

import random
import weakref
from typing import Any, Final, Literal, cast

import redis
from redis.cluster import ClusterNode, RedisCluster

from .redis_options import no_maint_notifications

#: What a redirect means for the command it refused (which did not run).
Redirect = Literal["moved", "busy"]
#: A redirect after which the slot lives elsewhere: refresh the slot map and reconnect.
MOVED: Final[Redirect] = "moved"
#: A redirect during a migration (or a cluster healing): back off and send the same step again.
BUSY: Final[Redirect] = "busy"

#: Back-off after ASK / TRYAGAIN / CLUSTERDOWN: doubles from FIRST to at most MAX, with jitter.
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def is_cluster_node(client: redis.Redis) -> bool:
    """Whether the server behind a plain client runs with `cluster-enabled yes`."""
    try:
        info = client.info("cluster")
    except redis.ResponseError:  # fakeredis, or INFO renamed: not a cluster we can tell
        return False
    return bool(int(info.get("cluster_enabled", 0)))


def cluster_client(url: str, **kwargs: Any) -> redis.Redis:
    """A RedisCluster seeded by `url`. Typed as `redis.Redis`: the library calls only commands
    that RedisCluster routes by key (EVAL/EVALSHA, list, hash and sorted-set commands, pipelines
    whose commands share one hash tag), and reaches a node itself (`node_client`) for the rest."""
    # Maintenance notifications off, as for every client of ours (redis_options.py).
    client = RedisCluster.from_url(url, **kwargs, **no_maint_notifications(RedisCluster))
    return cast(redis.Redis, client)


def _cluster(client: redis.Redis) -> Any:
    """The client as a RedisCluster, untyped (redis-py's cluster module has no annotations)."""
    return client


def owner_node(client: redis.Redis, key: str) -> ClusterNode:
    node = _cluster(client).get_node_from_key(key, replica=False)
    if node is None:  # pragma: no cover - a slot no master covers raises SlotNotCoveredError
        raise redis.exceptions.SlotNotCoveredError(f"no master serves the slot of {key!r}")
    return cast(ClusterNode, node)


def node_client(client: redis.Redis, key: str) -> redis.Redis:
    """The client of the node that serves `key` (the master owning its slot on a cluster; the
    client itself otherwise): for commands that must go to that node, not to any (TIME, INFO,
    CONFIG GET, CLUSTER GETKEYSINSLOT)."""
    if not is_cluster(client):
        return client
    node = owner_node(client, key)
    if node.redis_connection is None:  # pragma: no cover - created by the slot map's refresh
        _cluster(client).nodes_manager.create_redis_connections([node])
    conn = node.redis_connection
    assert conn is not None
    return cast(redis.Redis, conn)


def slot_owner(client: redis.Redis, key: str) -> tuple[int, str]:
    """On a cluster client: `key`'s slot and the `host:port` of the master serving it ("no node"
    when the slot map has none)."""
    slot = int(_cluster(client).keyslot(key))
    try:
        node = str(owner_node(client, key).name)
    except redis.RedisError:
        node = "no node"
    return slot, node


def route(client: redis.Redis, key: str) -> str:
    """Where `key` lives, for error messages: `slot 9450 on 127.0.0.1:7102` on a cluster,
    `host:port` otherwise."""
    if is_cluster(client):
        slot, node = slot_owner(client, key)
        return f"slot {slot} on {node}"
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def own_connection(client: redis.Redis, key: str) -> redis.connection.ConnectionInterface:
    """A connection of a worker's own, outside any pool (it is held for the worker's whole life
    and would otherwise count against the pool's limit forever), to the node that serves `key`.
    It is built like the pool's connections, so it has their timeouts, and retries off (no_retry,
    connection.py): a blind retry of a BLMOVE takes a second task."""
    pool = node_client(client, key).connection_pool
    # (The type by name: redis-py 5.0 has no ConnectionInterface at run time.)
    return cast(
        "redis.connection.ConnectionInterface", pool.connection_class(**pool.connection_kwargs)
    )


def reconnect(
    conn: redis.connection.ConnectionInterface,
    client: redis.Redis,
    key: str,
    *,
    refresh_map: bool = True,
) -> redis.connection.ConnectionInterface:
    """The own connection to use after MOVED, UNBLOCKED or a lost connection: `conn` is dropped;
    on a cluster, the slot map is re-read (unless `refresh_map` is False: the caller did) and a
    new own connection goes to the master that owns `key`'s slot now; on a single node `conn`
    itself stays (it reconnects on its next command)."""
    conn.disconnect()  # type: ignore[no-untyped-call]
    if not is_cluster(client):
        return conn
    if refresh_map:
        refresh(client)
    return own_connection(client, key)


def refresh(client: redis.Redis) -> None:
    """Re-read the slot map (after MOVED, UNBLOCKED, or a connection lost to a node that may have
    failed over). A no-op for a single node."""
    if is_cluster(client):
        _cluster(client).nodes_manager.initialize()


def redirect_kind(exc: BaseException) -> Redirect | None:
    """MOVED, BUSY or None (not a redirect). In each redirect case the command did not run."""
    if isinstance(exc, redis.exceptions.MovedError):
        return MOVED
    if isinstance(
        exc,
        redis.exceptions.AskError | redis.exceptions.TryAgainError | redis.exceptions.ClusterError,
    ):
        # ClusterError: CLUSTERDOWN (a failover under way), or the cluster client gave up
        # following redirects (its TTL): in both the command did not run.
        return BUSY
    if isinstance(exc, redis.ResponseError) and str(exc).startswith("UNBLOCKED"):
        # A blocked BLMOVE on a master that became a replica (a failover): not served.
        return MOVED
    if isinstance(exc, redis.exceptions.ReadOnlyError | redis.exceptions.RedisClusterException):
        # A write that reached a replica, or a slot the client's map has no node for: re-read
        # the map.
        return MOVED
    return None


_JITTER = random.Random()


class Backoff:
    """Pauses after BUSY redirects in a row: FIRST_BACKOFF doubling up to MAX_BACKOFF, each with
    up to 50 % jitter (so that a fleet of workers does not retry in lock step)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        # one shared generator by default: a release builds a Backoff every time, and seeding a
        # new Random from the OS costs more than the rest of the release's client-side work
        self.rng = rng or _JITTER
        self.count = 0

    def next(self) -> float:
        base = min(MAX_BACKOFF, FIRST_BACKOFF * (2 ** min(self.count, 16)))
        self.count += 1
        return float(base * (0.5 + self.rng.random() / 2))

    def reset(self) -> None:
        self.count = 0


# Whether a plain client's server is a cluster node, asked once per client (it cannot change
# while the server runs): tag_keys runs after every step of a verify run.
_node_kind: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _cluster_node_cached(client: redis.Redis) -> bool:
    known = _node_kind.get(client)
    if known is None:
        known = _node_kind[client] = is_cluster_node(client)
    return known


def tag_keys(client: redis.Redis, any_key: str, prefix: str) -> list[bytes]:
    """Every key starting with `prefix` in the slot of `any_key` (keys sharing one hash tag).

    On a cluster: `CLUSTER GETKEYSINSLOT` on the master that owns the slot -- never KEYS or SCAN,
    which see one node only. On a single node: SCAN (bounded per call, unlike KEYS)."""
    node: Any = node_client(client, any_key)
    want = prefix.encode()
    if is_cluster(client) or _cluster_node_cached(node):
        slot = int(node.execute_command("CLUSTER KEYSLOT", any_key))
        # Keys this run adds meanwhile are its own business: the margin only spares a loop.
        count = int(node.execute_command("CLUSTER COUNTKEYSINSLOT", slot))
        batch = node.execute_command("CLUSTER GETKEYSINSLOT", slot, 2 * count + 100)
        found = [k if isinstance(k, bytes) else str(k).encode() for k in batch]
        return [k for k in found if k.startswith(want)]
    pattern = prefix.replace("[", "\\[").replace("]", "\\]").replace("*", "\\*") + "*"
    return [
        k if isinstance(k, bytes) else str(k).encode()
        for k in node.scan_iter(match=pattern, count=1000)
    ]
