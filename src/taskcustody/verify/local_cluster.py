"""A throwaway local Redis Cluster, for trying `--cluster` by hand and for the test suite.

`python -m taskcustody.verify.local_cluster` starts 3 masters with a replica each (`--masters`,
`--replicas`) as `redis-server --cluster-enabled yes` on free ports of 127.0.0.1, joins them with
`redis-cli --cluster create`, waits for `cluster_state:ok`, prints a URL per node, and stops every
node by pid on Ctrl-C or SIGTERM (docs/local-cluster.md). The test suite's cluster
(tests/support/redis_cluster.py) is this one, with the faults a test injects added.

Each node is an `embedded.RedisServerProcess`, so starting, readiness, dying with its parent and
stopping are the single throwaway server's. A cluster node also listens on its bus port (port +
10000), so ports are picked with both free. Node config files go to a temporary directory of the
cluster's own, removed at the end; nothing else is written (no RDB, no AOF).
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
from types import FrameType
from typing import Any

import click
import redis

from .embedded import NoServerBinary, RedisServerProcess, redis_server_binary

#: Short enough for a test to see a node judged failed within seconds, long enough for a loaded
#: 2-core machine not to judge a busy node failed.
NODE_TIMEOUT_MS = 3000
#: Where a cluster bus listens: Redis's fixed offset from the node's port.
BUS_PORT_OFFSET = 10000


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
        if _bindable(port) and _bindable(port + BUS_PORT_OFFSET):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def cluster_info(port: int) -> dict[str, str]:
    """`CLUSTER INFO` of the node on `port`, as a dict of strings."""
    # (Any: redis-py's execute_command is unannotated.)
    client: Any = redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)
    try:
        text: Any = client.execute_command("CLUSTER INFO")
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
        """Start the nodes, create the cluster, wait until every node agrees it is ok. Raises
        NoServerBinary without redis-server or redis-cli."""
        cli = shutil.which("redis-cli")
        if redis_server_binary() is None or cli is None:
            raise NoServerBinary("a local cluster needs redis-server and redis-cli on PATH")
        self.workdir = tempfile.mkdtemp(prefix="taskcustody-cluster-")
        count = self.masters * (1 + self.replicas_per_master)
        for _ in range(count):
            port = free_cluster_port()
            node = RedisServerProcess(
                port=port,
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                    "--dir",
                    self.workdir,
                    "--repl-diskless-sync",
                    "yes",
                    "--repl-diskless-sync-delay",
                    "0",
                ),
            )
            node.start(attempts=1)
            self.nodes.append(node)
        addresses = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                str(self.replicas_per_master),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
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
            client: Any = self.client(port)
            try:
                repl: Any = client.info("replication")
                nodes: Any = client.execute_command("CLUSTER NODES")
            finally:
                client.close()
        except (redis.RedisError, OSError):
            return False
        # Every node must know every replica as one (gossip spreads CLUSTER REPLICATE).
        replicas = sum("slave" in fields["flags"] for fields in nodes.values())
        if replicas != self.masters * self.replicas_per_master:
            return False
        return bool(repl.get("role") == "master" or repl.get("master_link_status") == "up")

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5, socket_connect_timeout=5)

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

    def stop(self) -> None:
        """Stop every node by pid (resumed first, in case a test SIGSTOPped it) and remove the
        node config files."""
        for node in self.nodes:
            if node.proc is not None:
                with contextlib.suppress(OSError):
                    node.signal(signal.SIGCONT)
            node.stop()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def running(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """`cluster` started, every node stopped by pid afterwards (a failed start included)."""
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def throwaway_cluster(
    masters: int = 3, replicas_per_master: int = 1
) -> contextlib.AbstractContextManager[LocalCluster]:
    """A started cluster of `masters` masters with `replicas_per_master` replicas each."""
    return running(LocalCluster(masters, replicas_per_master))


class _Stop(Exception):
    """SIGTERM, turned into an exception so that the nodes are stopped as on Ctrl-C."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--masters",
    default=3,
    show_default=True,
    type=click.IntRange(min=3),
    help="Masters (redis-cli --cluster create needs at least 3); the 16384 slots are "
    "split evenly between them.",
)
@click.option(
    "--replicas",
    default=1,
    show_default=True,
    type=click.IntRange(min=0, max=5),
    help="Replicas per master (0 for the smallest cluster; 1 to try a CLUSTER FAILOVER).",
)
def main(masters: int, replicas: int) -> None:
    """Start a throwaway Redis Cluster on free ports of 127.0.0.1 for trying taskcustody's
    --cluster mode, print one URL per node, and stop every node on Ctrl-C (or SIGTERM).

    Needs redis-server and redis-cli on PATH (or $TASKCUSTODY_REDIS_SERVER for the server).
    Nothing is persisted: the nodes' config files live in a temporary directory removed at the
    end. Any node's URL, a replica's too, works as --redis-url."""
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        # Interrupted while it starts or while it runs: the nodes are stopped either way.
        with (
            contextlib.suppress(KeyboardInterrupt, _Stop),
            throwaway_cluster(masters, replicas) as cluster,
        ):
            primaries = cluster.master_ports()
            for port in cluster.ports:
                role = "master" if port in primaries else "replica"
                click.echo(f"redis://127.0.0.1:{port}/0  {role}")
            click.echo(f"cluster_state:ok ({masters} masters, {masters * replicas} replicas). Try:")
            click.echo(
                f"  taskcustody enqueue --queue demo --redis-url {cluster.url()} '{{\"n\": 1}}'"
            )
            click.echo(f"  taskcustody status --queue demo --redis-url {cluster.url()}")
            click.echo("Ctrl-C stops every node.")
            signal.pause()
    except NoServerBinary as exc:
        raise click.ClickException(str(exc)) from exc
    except subprocess.CalledProcessError as exc:
        said = exc.stderr.decode(errors="replace").strip() if exc.stderr else ""
        raise click.ClickException(f"redis-cli --cluster create failed: {said}") from exc
    except RuntimeError as exc:
        raise click.ClickException(f"the cluster did not start: {exc}") from exc
    finally:
        signal.signal(signal.SIGTERM, previous)
    click.echo("stopped every node")


if __name__ == "__main__":
    main()
