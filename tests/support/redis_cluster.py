"""A throwaway Redis Cluster: 6 `redis-server --cluster-enabled yes` on free ports (3 masters,
3 replicas), created with `redis-cli --cluster create`, stopped by pid.

Each node is a `RedisServerProcess` (tests/support/redis_server.py), so starting, readiness and
stopping are the single-server helper's. A cluster node also listens on its bus port (port +
10000), so ports are picked with both free. Node config files go to a temporary directory of the
cluster's own, removed at the end.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from tests.support.redis_server import RedisServerProcess

#: Short enough for a test to see a node judged failed within seconds, long enough for a loaded
#: 2-core machine not to judge a busy node failed.
NODE_TIMEOUT_MS = 3000


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port() -> int:
    """A port that is free together with its cluster bus port (port + 10000)."""
    for _ in range(1000):
        port = random.randint(20000, 45000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def cluster_info(port: int) -> dict[str, str]:
    client = redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)
    try:
        text = client.execute_command("CLUSTER INFO")
    finally:
        client.close()
    if isinstance(text, bytes):
        text = text.decode()
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    out = {}
    for line in str(text).splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


@dataclass
class LocalCluster:
    masters: int = 3
    replicas_per_master: int = 1
    nodes: list[RedisServerProcess] = field(default_factory=list)
    workdir: str = ""

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def url(self, index: int = 0) -> str:
        return self.nodes[index].url

    def start(self) -> LocalCluster:
        self.workdir = tempfile.mkdtemp(prefix="taskcustody-cluster-")
        count = self.masters * (1 + self.replicas_per_master)
        for _ in range(count):
            port = free_cluster_port()
            node = RedisServerProcess(port=port, extra_args=(
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--dir", self.workdir,
                "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
            ))
            node.start(attempts=1)
            self.nodes.append(node)
        addresses = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas",
             str(self.replicas_per_master), "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
        )
        self.wait_ok()
        return self

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every node reports cluster_state:ok, knows every node, and every replica's link
        to its master is up (a set-up wait, not an assertion about timing)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._node_ready(p) for p in self.ports):
                return
            time.sleep(0.1)
        raise RuntimeError(f"cluster on ports {self.ports} never reached cluster_state:ok")

    def _node_ready(self, port: int) -> bool:
        try:
            info = cluster_info(port)
            if info.get("cluster_state") != "ok":
                return False
            if int(info.get("cluster_known_nodes", 0)) != len(self.nodes):
                return False
            client = redis.Redis(port=port, socket_timeout=2)
            try:
                repl = client.info("replication")
                nodes = client.execute_command("CLUSTER NODES")
            finally:
                client.close()
        except (redis.RedisError, OSError):
            return False
        # Every node must know every replica as one (gossip spreads CLUSTER REPLICATE).
        replicas = sum("slave" in fields["flags"] for fields in nodes.values())
        if replicas != self.masters * self.replicas_per_master:
            return False
        return repl.get("role") == "master" or repl.get("master_link_status") == "up"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5, socket_connect_timeout=5)

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

    def master_ports(self) -> list[int]:
        out = []
        for port in self.ports:
            c = self.client(port)
            try:
                if c.info("replication").get("role") == "master":
                    out.append(port)
            except redis.RedisError:
                continue
            finally:
                c.close()
        return sorted(out)

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
                    source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000,
                                           "KEYS", key)
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

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None:
                with contextlib.suppress(OSError):
                    node.signal(signal.SIGCONT)
            node.stop()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def throwaway_cluster(masters: int = 3, replicas_per_master: int = 1) -> Iterator[LocalCluster]:
    """A started cluster, every node stopped by pid afterwards."""
    cluster = LocalCluster(masters, replicas_per_master)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


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


def main() -> None:
    """`python -m tests.support.redis_cluster`: start a throwaway cluster, print its nodes, and
    stop every node by pid on Ctrl-C (for trying taskcustody on a cluster by hand)."""
    with throwaway_cluster() as cluster:
        masters = cluster.master_ports()
        for port in cluster.ports:
            role = "master" if port in masters else "replica"
            print(f"redis://127.0.0.1:{port}/0  {role}", flush=True)
        print("cluster_state:ok; Ctrl-C stops every node", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
