"""The Redis a run happens on: its node on a cluster, a queue already in use refused, and the
run's keys deleted after each part."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import redis

from ..core.keys import QueueKeys
from ..deploy import cluster
from ..deploy.connection import connect
from .deployment import DeploymentError, describe
from .harness import VERIFY_SETTINGS


class QueueInUse(ValueError):
    """The run's queue on a real Redis already holds keys: they are somebody's, the run would
    delete them. Raised before any part runs."""


def refuse_a_queue_in_use(client: redis.Redis, keys: QueueKeys) -> None:
    found = cluster.tag_keys(client, keys.queue, keys.base + ":")
    if found:
        raise QueueInUse(
            f"the queue {keys.queue!r} already holds {len(found)} key(s) under {keys.base}: "
            f"(e.g. {min(found).decode(errors='replace')}); the run would delete them. Pick "
            "another queue name, or delete those keys if they are a dead run's."
        )


def node_url(url: str, keys: QueueKeys) -> str:
    """The URL the run talks to: `url` itself, or on a cluster the master that owns the run's
    slot (found through a cluster client seeded by `url`, which may be any node). The run needs
    a connection it can inject faults into, and every key it touches is in that one slot."""
    seed = connect(url, VERIFY_SETTINGS)
    try:
        if not cluster.is_cluster(seed):
            return url
        node = cluster.owner_node(seed, keys.queue)
        return with_address(url, str(node.host), int(node.port))
    except redis.RedisError as exc:
        raise DeploymentError(
            f"cannot find the node of {keys.queue} through {url}: {describe(exc)}"
        ) from exc
    finally:
        seed.close()


def with_address(url: str, host: str, port: int) -> str:
    """`url` with its host and port replaced (its scheme, user, password and options kept)."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def cleanup(make_client: Callable[[], redis.Redis], keys: QueueKeys) -> None:
    """Delete the run's keys: on a cluster those of its slot, on the master that owns it
    (`cluster.tag_keys`), never found with KEYS or SCAN on some node."""
    client = make_client()
    try:
        found = cluster.tag_keys(client, keys.queue, keys.base + ":")
        if found:
            client.delete(*found)
    finally:
        client.close()
