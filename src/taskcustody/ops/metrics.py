"""Prometheus metrics for one queue (`worker --metrics-port`), through prometheus-client, the
`metrics` extra (`pip install 'taskcustody[metrics]'`).

Counters come from the process's own steps (events.py): tasks committed, retried, dead-lettered
and whose custody was lost; tasks requeued by recovery; poison pills; the handler's duration as a
histogram. Gauges are read from Redis when scraped: queue depth, tasks in flight (in every
registered in-flight list), dead letters; and the age of this server's last accepted heartbeat.
Everything is labelled by queue; a Metrics object counts only events of its own queue's lists.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import redis

from ..core.keys import QueueKeys
from ..core.outcome import Action
from . import events
from .status import queue_status

if TYPE_CHECKING:
    from ..core.server import Server

log = logging.getLogger("taskcustody.metrics")

EXTRA_MESSAGE = (
    "--metrics-port needs the metrics extra (prometheus-client is not installed): "
    "pip install 'taskcustody[metrics]'"
)

#: The `outcome` label of each release action (Prometheus label values use underscores).
OUTCOMES: dict[Action, str] = {
    "committed": "committed",
    "retried": "retried",
    "dead-lettered": "dead_lettered",
    "lost-custody": "lost_custody",
}


class Metrics:
    """The metrics of one queue in a registry of their own (`registry`), counting from now on.
    `server` (optional) gives the heartbeat age. `close()` stops counting."""

    def __init__(
        self,
        client: redis.Redis,
        keys: QueueKeys,
        server: Server | None = None,
        registry: Any = None,
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.client = client
        self.keys = keys
        self.server = server
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lists = f"{keys.base}:inflight:"
        queue = keys.queue_name
        self.tasks = Counter(
            "taskcustody_tasks",
            "Tasks released, by outcome.",
            ["queue", "outcome"],
            registry=self.registry,
        )
        for outcome in OUTCOMES.values():
            self.tasks.labels(queue, outcome)  # exported at 0 before the first of each
        self.recovered = Counter(
            "taskcustody_recovered_tasks",
            "Tasks requeued by recovery (startup drain or sweep).",
            ["queue"],
            registry=self.registry,
        ).labels(queue)
        self.poison_pills = Counter(
            "taskcustody_poison_pills",
            "Tasks dead-lettered by recovery as poison pills.",
            ["queue"],
            registry=self.registry,
        ).labels(queue)
        self.duration = Histogram(
            "taskcustody_handler_duration_seconds",
            "Handler run time, successful or not.",
            ["queue"],
            registry=self.registry,
        ).labels(queue)
        self.registry.register(_RedisState(self))
        events.listeners.append(self.on_event)

    def close(self) -> None:
        if self.on_event in events.listeners:
            events.listeners.remove(self.on_event)

    def on_event(self, event: events.Event, fields: dict[str, Any]) -> None:
        if not str(fields.get("list_key", "")).startswith(self._lists):
            return  # another queue's
        if event == "released":
            self.tasks.labels(self.keys.queue_name, OUTCOMES[fields["action"]]).inc()
        elif event == "handled":
            self.duration.observe(fields["seconds"])
        elif event == "recovered":
            self.recovered.inc(fields["count"])
        elif event == "poison-pill":
            self.poison_pills.inc(fields["count"])

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve /metrics on `addr:port` from a daemon thread; returns the HTTP server (its
        `shutdown()` stops it)."""
        from prometheus_client import start_http_server

        httpd, _ = start_http_server(port, addr=addr, registry=self.registry)
        return httpd


class _RedisState:
    """The gauges, read when scraped (a Redis that does not answer leaves them out, and says so
    in the log, rather than failing the scrape of the counters)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Any]:
        return []  # no read of Redis at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        m = self.metrics
        queue = m.keys.queue_name
        try:
            server = m.server
            now = server.clock.now() if server is not None else 0.0
            snap = queue_status(m.client, m.keys, now)
        except (redis.RedisError, OSError) as exc:
            log.warning("metrics: cannot read the queue's state from Redis: %s", exc)
            return
        for name, doc, value in (
            ("taskcustody_queue_depth", "Tasks waiting in the queue.", snap.depth),
            (
                "taskcustody_in_flight",
                "Tasks in custody in registered in-flight lists.",
                sum(n for per_worker in snap.inflight.values() for n in per_worker.values()),
            ),
            ("taskcustody_dead_letters", "Entries in the dead-letter list.", snap.dead_letters),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["queue"])
            gauge.add_metric([queue], value)
            yield gauge
        if server is not None and server.last_heartbeat is not None:
            gauge = GaugeMetricFamily(
                "taskcustody_heartbeat_age_seconds",
                "Seconds since this server's last heartbeat that Redis accepted.",
                labels=["queue", "server_id"],
            )
            gauge.add_metric([queue, server.server_id], max(0.0, now - server.last_heartbeat))
            yield gauge
