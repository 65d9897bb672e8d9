"""The worker's start banner says where it works: the URL the user gave (password masked), and on
a Redis Cluster the node that serves the queue's slot, labelled as such -- not whichever node the
cluster client picked as its default."""

from __future__ import annotations

import logging

import pytest

from taskcustody import ManualClock, QueueKeys, connect
from taskcustody.core.server import Server
from taskcustody.ops.logs import redact_url
from tests.conftest import TEST_SETTINGS
from tests.helpers import make_server
from tests.support.redis_cluster import LocalCluster, tags_on_distinct_masters
from tests.support.redis_server import RedisServerProcess


def banner_of(server: Server, caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    with caplog.at_level(logging.INFO, logger="taskcustody.server"):
        workers = server.start()
    for worker in workers:
        worker.close()
    (banner,) = [
        r
        for r in caplog.records
        if r.name == "taskcustody.server" and r.getMessage().startswith("started:")
    ]
    return banner


def test_the_banner_names_the_url_as_given_with_the_password_masked(
    real_redis: RedisServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # The default user has no password (nopass): AUTH with a user name accepts any.
    url = f"redis://default:s3cret@127.0.0.1:{real_redis.port}"
    client = connect(url, TEST_SETTINGS)
    client.flushall()
    banner = banner_of(make_server(client, QueueKeys("given"), "s1", ManualClock()), caplog)
    message = banner.getMessage()
    assert f" at redis://default:***@127.0.0.1:{real_redis.port}, shutdown grace" in message
    assert "s3cret" not in message and "Cluster" not in message
    assert banner.redis_url == f"redis://default:***@127.0.0.1:{real_redis.port}"  # type: ignore[attr-defined]


def test_a_password_in_the_query_string_is_masked_too() -> None:
    assert (
        redact_url("redis://h:6379/0?username=u&password=s3cret&ssl=false")
        == "redis://h:6379/0?username=u&password=***&ssl=false"
    )


@pytest.mark.cluster
@pytest.mark.real_redis
def test_the_banner_on_a_cluster_names_the_seed_given_and_the_node_serving_the_slot(
    local_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # The seed is a replica: never the node a cluster client picks as its default (a master).
    seed_port = local_cluster.replica_of(local_cluster.master_ports()[0])
    seed = f"redis://127.0.0.1:{seed_port}/0"
    client = connect(seed, TEST_SETTINGS)
    default = client.get_default_node()  # type: ignore[attr-defined]
    # A queue whose slot another master than the client's default serves.
    queue = next(
        name
        for name in tags_on_distinct_masters(local_cluster, "banner")
        if local_cluster.owner_port(QueueKeys(name).queue) != default.port
    )
    keys = QueueKeys(queue)
    owner = local_cluster.owner_port(keys.queue)
    slot = local_cluster.keyslot(keys.queue)
    server = make_server(client, keys, "s1", ManualClock())
    try:
        banner = banner_of(server, caplog)
    finally:
        server.deregister()
    assert (
        f" at {seed} (Redis Cluster: the queue's slot {slot} is served by "
        f"127.0.0.1:{owner}), shutdown grace"
    ) in banner.getMessage()
    assert f":{default.port}" not in banner.getMessage()
    assert (banner.redis_url, banner.cluster_slot, banner.slot_node) == (  # type: ignore[attr-defined]
        seed,
        slot,
        f"127.0.0.1:{owner}",
    )
