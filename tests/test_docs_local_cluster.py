"""docs/local-cluster.md's commands work as written: its by-hand shell blocks start a 3-master
cluster with redis-server and redis-cli, the taskcustody commands it shows serve a queue on it, and
its stop block stops every node. Only the ports (free ones picked here) and the worker (which
would serve forever) differ from the page. The quick way's options are the command's own."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from taskcustody import QueueKeys, connect
from taskcustody.cli.app import main
from taskcustody.deploy.cluster import is_cluster
from taskcustody.deploy.connection import no_retry
from taskcustody.verify.local_cluster import free_cluster_port
from taskcustody.verify.local_cluster import main as local_cluster
from tests.conftest import cluster_binaries_present
from tests.test_docs_guide import fenced_blocks

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "local-cluster.md"
DOC_PORTS = ("30001", "30002", "30003")

pytestmark = pytest.mark.skipif(
    not (ROOT / "docs").is_dir(), reason="no docs/ (e.g. the mutation gate's copy)"
)


def bash_blocks() -> list[str]:
    return [
        "\n".join(body) for language, body in fenced_blocks(PAGE.read_text()) if language == "bash"
    ]


def test_the_quick_way_shows_options_the_command_has() -> None:
    quick = bash_blocks()[0]
    assert quick.count("python -m taskcustody.verify.local_cluster") == 2
    # Its commands' options, and those its prose names (not the printed example's).
    section = PAGE.read_text().split("## The quick way", 1)[1].split("## By hand", 1)[0]
    prose = re.sub(r"```.*?```", "", section, flags=re.S)
    named = set(re.findall(r"(--[\w-]+)", quick)) | set(re.findall(r"`(--[\w-]+)", prose))
    help_text = CliRunner().invoke(local_cluster, ["--help"]).output
    assert named and sorted(o for o in named if o not in help_text) == []


def _kill_leftovers(workdir: Path) -> None:
    """The nodes the blocks started, by the pid each wrote, if the stop block did not run."""
    for pidfile in workdir.glob("*.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)


@pytest.mark.cluster
@pytest.mark.real_redis
def test_the_by_hand_blocks_start_a_cluster_that_serves_a_queue_and_stop_it(
    tmp_path: Path,
) -> None:
    if not cluster_binaries_present():
        if os.environ.get("CI"):
            pytest.fail("CI: redis-server and redis-cli are needed for the cluster tests")
        pytest.skip("no redis-server/redis-cli binary")
    _, start, use, stop = bash_blocks()
    ports: list[str] = []
    while len(ports) < 3:
        port = str(free_cluster_port())
        if port not in ports:
            ports.append(port)

    def here(block: str) -> str:
        for doc_port, port in zip(DOC_PORTS, ports, strict=True):
            block = block.replace(doc_port, port)
        return block.replace("DIR=$(mktemp -d)", f"DIR={shlex.quote(str(tmp_path))}")

    assert 'PORTS="30001 30002 30003"' in start and "DIR=$(mktemp -d)" in start
    try:
        # One shell, as the page says: the stop block needs the start block's $PORTS and $DIR.
        started = subprocess.run(
            ["bash", "-euc", here(start)], capture_output=True, text=True, timeout=120
        )
        assert started.returncode == 0, started.stderr
        assert sorted(p.name for p in tmp_path.glob("*.pid")) == sorted(f"{p}.pid" for p in ports)

        commands = [shlex.split(line) for line in here(use).splitlines()]
        assert [c[:2] for c in commands] == [
            ["taskcustody", "enqueue"],
            ["taskcustody", "status"],
            ["taskcustody", "worker"],
        ]
        for args in commands[:2]:  # the worker would serve until stopped
            result = CliRunner().invoke(main, args[1:])
            assert result.exit_code == 0, result.output
        client = connect(f"redis://127.0.0.1:{ports[2]}/0")
        assert is_cluster(client) and client.llen(QueueKeys("demo").queue) == 2
        client.close()

        # What the start block's shell would still hold: $PORTS and $DIR.
        stopped = subprocess.run(
            ["bash", "-euc", stop],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, PORTS=" ".join(ports), DIR=str(tmp_path)),
        )
        assert stopped.returncode == 0, stopped.stderr
    finally:
        if tmp_path.exists():
            _kill_leftovers(tmp_path)
    assert not tmp_path.exists()  # the stop block removed the nodes' files
    for port in ports:
        node = redis.Redis(port=int(port), socket_connect_timeout=1, retry=no_retry())
        # A node stopped by SIGTERM may still be closing its socket: ask until it is gone.
        for _ in range(100):
            try:
                node.ping()
            except redis.ConnectionError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the node on {port} still answers after the stop block")
        node.close()
