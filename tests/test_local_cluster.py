"""`python -m taskcustody.verify.local_cluster`: the throwaway Redis Cluster a user starts to try
`--cluster` (docs/local-cluster.md). It prints a URL per node, the cluster serves taskcustody
through any of them, and Ctrl-C or SIGTERM stops every node it started."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from taskcustody import QueueKeys, connect
from taskcustody.cli.app import main as taskcustody
from taskcustody.deploy.cluster import is_cluster
from taskcustody.deploy.connection import no_retry
from taskcustody.verify.local_cluster import main
from tests.conftest import cluster_binaries_present

ROOT = Path(__file__).resolve().parent.parent
#: A set-up bound: a broken start fails the test instead of hanging it.
START_LIMIT = 120.0


def test_the_local_cluster_command_explains_itself() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "--masters INTEGER RANGE" in text and "--replicas INTEGER RANGE" in text
    assert "stop every node on Ctrl-C (or SIGTERM)" in text


def test_fewer_than_three_masters_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["--masters", "2"])
    assert result.exit_code == 2 and "--masters" in result.output


def test_without_redis_cli_it_says_what_it_needs_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("taskcustody.verify.local_cluster.shutil.which", lambda name: None)
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 1
    assert result.output == "Error: a local cluster needs redis-server and redis-cli on PATH\n"


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The child's stdout lines as they come (read in a thread: a line that never comes must not
    block the test past its bound)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


@pytest.mark.cluster
@pytest.mark.real_redis
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "term"])
def test_the_printed_urls_serve_a_queue_and_a_signal_stops_every_node(
    stop_signal: signal.Signals,
) -> None:
    if not cluster_binaries_present():
        if os.environ.get("CI"):
            pytest.fail("CI: redis-server and redis-cli are needed for the cluster tests")
        pytest.skip("no redis-server/redis-cli binary")
    # This tree's code in the child, whatever the environment's install points at.
    path = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "model"), os.environ.get("PYTHONPATH", "")]
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskcustody.verify.local_cluster", "--replicas", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
    )
    try:
        lines = lines_of(proc)
        printed = []
        while not printed or printed[-1] != "Ctrl-C stops every node.":
            printed.append(lines.get(timeout=START_LIMIT))
        urls = [line.split()[0] for line in printed if line.startswith("redis://")]
        assert [line.split()[1] for line in printed[:3]] == ["master"] * 3
        assert len(urls) == 3
        # Any node seeds a cluster client; the CLI's example commands work as printed.
        client = connect(urls[2])
        assert is_cluster(client)
        enqueued = CliRunner().invoke(
            taskcustody, ["enqueue", "--queue", "demo", "--redis-url", urls[0], '{"n": 1}']
        )
        assert enqueued.exit_code == 0, enqueued.output
        assert client.llen(QueueKeys("demo").queue) == 1
        client.close()

        proc.send_signal(stop_signal)
        assert proc.wait(timeout=60) == 0
        assert lines.get(timeout=10) == "stopped every node"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for url in urls:
        node = redis.Redis.from_url(url, socket_connect_timeout=1, retry=no_retry())
        with pytest.raises(redis.ConnectionError):
            node.ping()
        node.close()
