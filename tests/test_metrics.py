"""Prometheus metrics, tested by scraping the endpoint: tasks committed,
retried, dead-lettered and lost-custody; tasks requeued by recovery and poison pills; queue
depth, in-flight and dead-letter counts; handler duration; heartbeat age. The `metrics` extra is
optional: without it, --metrics-port says which extra to install."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, connect
from taskcustody.core.envelope import encode, new_task
from taskcustody.core.keys import ListOwner
from taskcustody.core.recovery import Recovering, drain_inflight
from taskcustody.ops import events
from tests.conftest import Backend
from tests.helpers import make_server
from tests.support.redis_server import free_port, throwaway_redis_server
from tests.support.waiting import wait_for

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from taskcustody.ops.metrics import Metrics  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("taskcustody"))


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def served(backend: Backend, keys: QueueKeys) -> Iterator[tuple[redis.Redis, Metrics, int]]:
    client = backend.client()
    metrics = Metrics(client, keys)
    port = free_port()
    httpd = metrics.serve(port, "127.0.0.1")
    try:
        yield client, metrics, port
    finally:
        httpd.shutdown()
        metrics.close()


def fail_on_bad(payload: object) -> str:
    if payload == "bad":
        raise RuntimeError("bad payload")
    return "ok"


def test_the_endpoint_counts_each_outcome_and_reads_the_queue_from_redis(
    served: tuple[redis.Redis, Metrics, int], keys: QueueKeys
) -> None:
    client, _, port = served
    q = keys.queue_name
    before = scrape(port)
    for outcome in ("committed", "retried", "dead_lettered", "lost_custody"):
        assert value(before, "taskcustody_tasks_total", queue=q, outcome=outcome) == 0
    Producer(client, keys).enqueue_many(["good", "bad"])
    (worker,) = make_server(client, keys, "s1", ManualClock(), fail_on_bad).start()
    # good commits; bad fails 3 times (2 retries, then a dead letter): 4 runs in all.
    runs = 0
    while worker.run_once(timeout=0.05):
        runs += 1
    worker.close()
    assert runs == 4
    Producer(client, keys).enqueue_many(["waiting", "waiting"])
    after = scrape(port)
    assert value(after, "taskcustody_tasks_total", queue=q, outcome="committed") == 1
    assert value(after, "taskcustody_tasks_total", queue=q, outcome="retried") == 2
    assert value(after, "taskcustody_tasks_total", queue=q, outcome="dead_lettered") == 1
    assert value(after, "taskcustody_handler_duration_seconds_count", queue=q) == 4
    assert value(after, "taskcustody_queue_depth", queue=q) == client.llen(keys.queue)
    assert value(after, "taskcustody_dead_letters", queue=q) == 1
    assert value(after, "taskcustody_in_flight", queue=q) == 0


def test_recovery_lost_custody_and_poison_pills_are_counted(
    served: tuple[redis.Redis, Metrics, int], keys: QueueKeys
) -> None:
    client, _, port = served
    q = keys.queue_name
    # Two tasks in a dead holder's list: in flight until recovered.
    owner = ListOwner("gone", 7, "w0")
    for payload in ("a", "b"):
        client.lpush(keys.inflight(owner), encode(new_task(payload, 0.0)))
    client.zadd(keys.inflight_registry, {keys.inflight(owner): 0})
    assert value(scrape(port), "taskcustody_in_flight", queue=q) == 2
    assert drain_inflight(client, keys, keys.inflight(owner), force=True) == 2
    # A task recovered once too often: a poison pill.
    client.lpush(keys.inflight(owner), encode(new_task("pill", 0.0)))
    drain_inflight(
        client, keys, keys.inflight(owner), force=True, recovering=Recovering(max_recoveries=0)
    )
    # Custody lost: the handler's own list is drained while it runs.
    holder: list[str] = []

    def drained_meanwhile(payload: object) -> None:
        drain_inflight(client, keys, holder[0], force=True)

    (worker,) = make_server(client, keys, "s1", ManualClock(), drained_meanwhile).start()
    holder.append(worker.list_key)
    assert worker.run_once(timeout=0.05)
    worker.close()
    samples = scrape(port)
    assert value(samples, "taskcustody_recovered_tasks_total", queue=q) == 3  # a, b, then 1
    assert value(samples, "taskcustody_poison_pills_total", queue=q) == 1
    assert value(samples, "taskcustody_tasks_total", queue=q, outcome="lost_custody") == 1
    assert value(samples, "taskcustody_in_flight", queue=q) == 0


def test_another_queues_events_are_not_counted_and_close_stops_counting(
    served: tuple[redis.Redis, Metrics, int], keys: QueueKeys
) -> None:
    client, metrics, port = served
    other = QueueKeys("other-queue")
    Producer(client, other).enqueue("x")
    (worker,) = make_server(client, other, "s1", ManualClock()).start()
    assert worker.run_once(timeout=0.05)
    assert (
        value(scrape(port), "taskcustody_tasks_total", queue=keys.queue_name, outcome="committed")
        == 0
    )
    metrics.close()
    assert metrics.on_event not in events.listeners
    Producer(client, keys).enqueue("y")
    (mine,) = make_server(client, keys, "s2", ManualClock()).start()
    assert mine.run_once(timeout=0.05)
    worker.close()
    mine.close()
    assert (
        value(scrape(port), "taskcustody_tasks_total", queue=keys.queue_name, outcome="committed")
        == 0
    )


def test_heartbeat_age_is_the_time_since_the_last_accepted_heartbeat(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock(1000.0)
    server = make_server(client, keys, "s1", clock)
    metrics = Metrics(client, keys, server)
    port = free_port()
    httpd = metrics.serve(port, "127.0.0.1")
    try:
        assert (
            "taskcustody_heartbeat_age_seconds",
            (("queue", keys.queue_name), ("server_id", "s1")),
        ) not in scrape(port)
        server.claim()
        clock.advance(4)
        assert (
            value(
                scrape(port),
                "taskcustody_heartbeat_age_seconds",
                queue=keys.queue_name,
                server_id="s1",
            )
            == 4
        )
        server.heartbeat()
        clock.advance(1.5)
        assert (
            value(
                scrape(port),
                "taskcustody_heartbeat_age_seconds",
                queue=keys.queue_name,
                server_id="s1",
            )
            == 1.5
        )
    finally:
        httpd.shutdown()
        metrics.close()


def test_an_unreachable_redis_leaves_the_gauges_out_not_the_counters(keys: QueueKeys) -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=1)
    metrics = Metrics(client, keys)
    port = free_port()
    httpd = metrics.serve(port, "127.0.0.1")
    try:
        samples = scrape(port)
    finally:
        httpd.shutdown()
        metrics.close()
    assert (
        value(samples, "taskcustody_tasks_total", queue=keys.queue_name, outcome="committed") == 0
    )
    assert value(samples, "taskcustody_queue_depth", queue=keys.queue_name) is None


@pytest.mark.real_redis
def test_worker_metrics_port_serves_the_metrics_of_a_running_worker() -> None:
    port = free_port()
    with throwaway_redis_server() as server:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.Popen(
            [
                CLI,
                "worker",
                "json:dumps",
                "-q",
                "m",
                "--redis-url",
                server.url,
                "--metrics-port",
                str(port),
                "--metrics-addr",
                "127.0.0.1",
                "--block-timeout",
                "0.1",
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            client = connect(server.url)
            Producer(client, QueueKeys("m")).enqueue_many(list(range(5)))

            def committed() -> float | None:
                try:
                    return value(
                        scrape(port), "taskcustody_tasks_total", queue="m", outcome="committed"
                    )
                except OSError:
                    return None

            wait_for(
                lambda: committed() == 5,
                "5 commits on the metrics endpoint",
                limit=60,
                state=committed,
            )
            samples = scrape(port)
            assert value(samples, "taskcustody_queue_depth", queue="m") == 0
            assert value(samples, "taskcustody_handler_duration_seconds_count", queue="m") == 5
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
            assert proc.stderr is not None
            assert f"metrics on http://127.0.0.1:{port}/metrics" in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_metrics_port_without_the_extra_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from taskcustody.cli import main\n"
        f"main(['worker', 'json:dumps', '-q', 'm', '--redis-url', "
        f"'redis://127.0.0.1:{free_port()}/0', '--metrics-port', '9999'], "
        "prog_name='taskcustody')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 1
    assert result.stderr.endswith(
        "Error: --metrics-port needs the metrics extra (prometheus-client is not installed): "
        "pip install 'taskcustody[metrics]'\n"
    )
