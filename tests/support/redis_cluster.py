"""The test suite's throwaway Redis Cluster: 6 `redis-server --cluster-enabled yes` on free ports
(3 masters, 3 replicas), created with `redis-cli --cluster create`, stopped by pid.

Starting, readiness and stopping are taskcustody.verify.local_cluster's (the cluster a user starts
with `python -m taskcustody.verify.local_cluster`, docs/local-cluster.md); this module adds what
only tests do to a cluster: find a key's master, fail a master over, migrate a slot live.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import redis

from taskcustody.verify import local_cluster
from taskcustody.verify.local_cluster import NODE_TIMEOUT_MS, cluster_info, free_cluster_port

__all__ = [
    "NODE_TIMEOUT_MS",
    "LocalCluster",
    "cluster_info",
    "free_cluster_port",
    "tags_on_distinct_masters",
    "throwaway_cluster",
]


class LocalCluster(local_cluster.LocalCluster):
    """The user's local cluster, with what tests look up and do to it."""

    def owner_port(self, key: str) -> int:
        """The port of the master that serves `key`'s slot (read from the node map of any
        master)."""
        slot = self.keyslot(key)
        for port in self.ports:
            c = self.client(port)
            try:
                for start, end, master, *_ in c.execute_command("CLUSTER SLOTS"):
                    if int(start) <= slot <= int(end):
                        return int(master[1])
            except redis.RedisError:
                continue
            finally:
                c.close()
        raise RuntimeError(f"no node serves slot {slot}")

    def keyslot(self, key: str) -> int:
        c = self.client(self.ports[0])
        try:
            return int(c.execute_command("CLUSTER KEYSLOT", key))
        finally:
            c.close()

    def node_id(self, port: int) -> str:
        c = self.client(port)
        try:
            return str(c.execute_command("CLUSTER MYID").decode())
        finally:
            c.close()

    def replica_of(self, master_port: int) -> int:
        """A replica port of the master on `master_port`."""
        master_id = self.node_id(master_port)
        c = self.client(master_port)
        try:
            nodes = c.execute_command("CLUSTER NODES")  # redis-py parses it: address -> fields
        finally:
            c.close()
        for address, fields in nodes.items():
            if fields["master_id"] == master_id and "slave" in fields["flags"]:
                return int(address.split(":")[1].split("@")[0])
        raise RuntimeError(f"master on {master_port} has no replica")

    def failover(self, master_port: int, timeout: float = 30.0) -> int:
        """`CLUSTER FAILOVER` (the coordinated, manual one: the master pauses its clients until
        the replica has every write, so none is lost) on a replica of `master_port`; returns the
        new master's port once it is master and every node agrees (a set-up wait)."""
        replica = self.replica_of(master_port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # A master votes for one replica of a given master per 2 x node timeout: a failover
            # soon after another of the same pair is refused, and Redis aborts it after 5 s.
            # Ask again until it is carried out.
            c = self.client(replica)
            try:
                c.execute_command("CLUSTER FAILOVER")
            except redis.ResponseError:
                pass  # e.g. the previous attempt is still in progress: wait for it
            finally:
                c.close()
            attempt_ends = time.monotonic() + 2 * NODE_TIMEOUT_MS / 1000 + 1
            while time.monotonic() < min(deadline, attempt_ends):
                masters = self.master_ports()
                if replica in masters and master_port not in masters:
                    self.wait_ok(timeout)
                    return replica
                time.sleep(0.05)
        raise RuntimeError(f"failover of {master_port} to {replica} did not complete")

    def migrate_slot(self, slot: int, target_port: int, pause: float = 0.0) -> int:
        """A live migration of `slot` to the master on `target_port`, as redis-cli --cluster
        reshard does it: SETSLOT IMPORTING on the target, MIGRATING on the source, MIGRATE of
        the slot's keys (one key per MIGRATE, `pause` seconds apart, so that clients meet the
        half-moved slot: ASK and TRYAGAIN), then SETSLOT NODE on every master. Returns how many
        keys moved."""
        source_port = self._slot_owner(slot)
        source, target = self.client(source_port), self.client(target_port)
        source_id, target_id = self.node_id(source_port), self.node_id(target_port)
        moved = 0
        try:
            target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
            while True:
                keys = source.execute_command("CLUSTER GETKEYSINSLOT", slot, 10)
                if not keys:
                    break
                for key in keys:
                    source.execute_command(
                        "MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", key
                    )
                    moved += 1
                    if pause:
                        time.sleep(pause)
            # The target first, then the source: what redis-cli does, so that no node ever
            # redirects to a node that refuses the slot.
            target.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
            source.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
            for port in self.master_ports():
                if port not in (source_port, target_port):
                    c = self.client(port)
                    try:
                        c.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
                    finally:
                        c.close()
        finally:
            source.close()
            target.close()
        self.wait_ok()
        return moved

    def _slot_owner(self, slot: int) -> int:
        for port in self.master_ports():
            c = self.client(port)
            try:
                for start, end, master, *_ in c.execute_command("CLUSTER SLOTS"):
                    if int(start) <= slot <= int(end):
                        return int(master[1])
            finally:
                c.close()
        raise RuntimeError(f"no node serves slot {slot}")


@contextlib.contextmanager
def throwaway_cluster(masters: int = 3, replicas_per_master: int = 1) -> Iterator[LocalCluster]:
    """A started cluster, every node stopped by pid afterwards."""
    with local_cluster.running(LocalCluster(masters, replicas_per_master)) as cluster:
        yield cluster


def tags_on_distinct_masters(cluster: LocalCluster, prefix: str = "q") -> list[str]:
    """One queue name per master: names `prefix0`, `prefix1`, ... picked with CLUSTER KEYSLOT so
    that their hash tags' slots are served by different masters."""
    chosen: dict[int, str] = {}
    masters = cluster.master_ports()
    for n in range(10_000):
        name = f"{prefix}{n}"
        owner = cluster.owner_port(f"{{{name}}}")
        if owner not in chosen:
            chosen[owner] = name
        if len(chosen) == len(masters):
            return [chosen[p] for p in masters]
    raise RuntimeError("could not place a queue on every master")
