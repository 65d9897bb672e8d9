"""`taskcustody worker`: serve a queue with a handler, in threads or (for an `async def` handler)
on asyncio, with optional Prometheus metrics. Registered on the group of `app.py`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import click
import redis

from ..aio import AsyncServer, connect_async, is_async_handler
from ..core.clock import RedisClock
from ..core.keys import QueueKeys
from ..core.server import MAX_WORKER_THREADS, Server, default_server_id
from ..core.settings import MAX_SECONDS, Settings
from ..deploy import cluster as cluster_routing
from ..ops import logs
from .app import (
    _client,
    _keys,
    _run,
    _settings,
    allow_evicting_option,
    cluster_option,
    load_handler,
    main,
    prefix_option,
    queue_option,
    registry_grace_option,
    replication_options,
    url_option,
)
from .errors import Failure


@main.command()
@click.argument("handler")
@queue_option
@prefix_option
@url_option
@click.option(
    "--workers",
    "-w",
    default=1,
    show_default=True,
    type=click.IntRange(min=1, max=MAX_WORKER_THREADS),
    help="Worker threads (each holds its own Redis connection).",
)
@click.option(
    "--prefetch",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tasks a worker thread (an asyncio worker, for an async def handler) takes in "
    "one round trip while the queue is busy (each held in an in-flight list of its "
    "own). Raise it for short tasks; keep "
    "1 for long ones, or the prefetched tasks wait behind a slow one.",
)
@click.option(
    "--server-id",
    default=None,
    envvar="TASKCUSTODY_SERVER_ID",
    help="Exclusive server id (or $TASKCUSTODY_SERVER_ID). Default: HOST-PID-XXXX, "
    "unique per process; a crashed process's tasks are then recovered by the "
    "sweep once its lease lapses. A stable id (e.g. a StatefulSet pod name) has "
    "a restart recover them itself at start. See docs/guides/operations.md.",
)
@click.option(
    "--max-attempts",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Handler runs (releases) before a failing task is dead-lettered.",
)
@click.option(
    "--max-recoveries",
    default=3,
    show_default=True,
    type=click.IntRange(min=0),
    help="Times recovery may take a task back from a holder that died (a process "
    "killed by the task: OOM killer, segfault) before the task is dead-lettered "
    "as a poison pill.",
)
@click.option(
    "--retry-backoff",
    default=Settings.retry_backoff,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Base delay in seconds before a failed task is retried: attempt n waits a "
    "random time up to min(--retry-backoff-max, base * 2**(n-1)) (full jitter) in "
    "the scheduled set. 0 retries at once.",
)
@click.option(
    "--retry-backoff-max",
    default=Settings.retry_backoff_max,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Cap of the retry delay, in seconds.",
)
@click.option(
    "--block-timeout",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0.01),
    help="Seconds a take blocks in Redis (BLMOVE) on an empty queue before it returns "
    "empty-handed: an idle worker notices a stop within this long. The socket "
    "timeout is this plus 3 s.",
)
@click.option(
    "--heartbeat-interval",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.01),
    help="Seconds between heartbeats.",
)
@click.option(
    "--server-ttl",
    default=15.0,
    show_default=True,
    type=click.FloatRange(min=0.02),
    help="A server that has not heart-beaten for this long is judged dead.",
)
@click.option(
    "--sweep-interval",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.01),
    help="Seconds between recovery passes.",
)
@click.option(
    "--wait-for-id",
    default=None,
    type=click.FloatRange(min=0),
    help="If a live process holds the server id, wait this long for its lease to "
    "lapse instead of failing at once. Default: with --server-id, server-ttl "
    "plus a heartbeat (a restart after a crash waits out the dead process's "
    "lease, then recovers its tasks); with the default id, 0.",
)
@click.option(
    "--shutdown-grace",
    default=Settings.shutdown_grace,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds a SIGTERM/SIGINT leaves running tasks to finish. A second signal "
    "exits at once: the tasks in flight stay in custody and are recovered as "
    "after a crash.",
)
@click.option(
    "--result-ttl",
    default=Settings.result_ttl,
    show_default=True,
    type=click.IntRange(min=0),
    help="Seconds a task's result is kept after it commits, for `taskcustody result` "
    "(every committed task leaves one key that long); 0 stores no results.",
)
@click.option(
    "--track-commits", is_flag=True, help="Keep a per-task commit count (for verification runs)."
)
@allow_evicting_option
@replication_options
@registry_grace_option
@cluster_option
@click.option(
    "--log-level",
    type=click.Choice(logs.LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="info: the start banner, and a line per retry, dead letter, lost custody, "
    "poison pill and recovered task; debug adds every commit.",
)
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS),
    default="text",
    show_default=True,
    help="json: one object per line, the task id as `task_id`.",
)
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(1, 65535),
    help="Serve Prometheus metrics on this port (/metrics; needs the metrics extra: "
    "pip install 'taskcustody[metrics]').",
)
@click.option(
    "--metrics-addr",
    default="0.0.0.0",
    show_default=True,
    help="Address the metrics endpoint listens on.",
)
@click.option("--verbose", "-v", is_flag=True, help="Same as --log-level debug.")
def worker(
    handler: str,
    queue: str,
    prefix: str,
    redis_url: str,
    workers: int,
    prefetch: int,
    server_id: str | None,
    max_attempts: int,
    max_recoveries: int,
    retry_backoff: float,
    retry_backoff_max: float,
    block_timeout: float,
    heartbeat_interval: float,
    server_ttl: float,
    sweep_interval: float,
    wait_for_id: float | None,
    shutdown_grace: float,
    result_ttl: int,
    track_commits: bool,
    allow_evicting_policy: bool,
    min_replicas: int,
    replica_timeout: float,
    registry_grace: float,
    cluster: bool | None,
    metrics_port: int | None,
    metrics_addr: str,
    log_level: str,
    log_format: str,
    verbose: bool,
) -> None:
    """Run a server with WORKERS threads executing HANDLER (MODULE:FUNCTION) on each payload.
    The current directory is on the handler's import path.

    SIGTERM or SIGINT: stop taking, finish current tasks within --shutdown-grace, deregister.
    A second one exits at once (its tasks are recovered as after a crash).
    """
    logs.configure_while(click.get_current_context(), "debug" if verbose else log_level, log_format)
    fn = load_handler(handler)
    settings = _settings(
        max_attempts=max_attempts,
        max_recoveries=max_recoveries,
        retry_backoff=retry_backoff,
        retry_backoff_max=retry_backoff_max,
        block_timeout=block_timeout,
        heartbeat_interval=heartbeat_interval,
        server_ttl=server_ttl,
        sweep_interval=sweep_interval,
        track_commits=track_commits,
        prefetch=prefetch,
        allow_evicting_policy=allow_evicting_policy,
        min_replicas=min_replicas,
        replica_timeout=replica_timeout,
        registry_grace=registry_grace,
        result_ttl=result_ttl,
        shutdown_grace=shutdown_grace,
    )
    if wait_for_id is not None and not 0 <= wait_for_id <= MAX_SECONDS:  # NaN fails both
        raise click.BadParameter(
            f"{wait_for_id} is not a number of seconds in [0, {MAX_SECONDS:.0f}]",
            param_hint="--wait-for-id",
        )
    client = _client(redis_url, settings, cluster)
    if wait_for_id is None:
        # A stable id may be a restart's after a crash: wait the dead lease out (the startup
        # drain then recovers its tasks). The default id is new each time: nobody holds it.
        wait_for_id = server_ttl + heartbeat_interval if server_id else 0.0
    sid = server_id or default_server_id()
    keys = _keys(queue, prefix)
    if is_async_handler(fn):
        # An `async def` handler runs on the asyncio server, with `workers` concurrent workers.
        _run_async(
            fn,
            redis_url,
            settings,
            client,
            keys,
            sid,
            workers,
            wait_for_id,
            cluster,
            metrics_port,
            metrics_addr,
        )
        return
    srv = Server(
        client,
        keys,
        sid,
        fn,
        workers=workers,
        settings=settings,
        clock=RedisClock(client, key=keys.queue),
    )
    if metrics_port is not None:
        _serve_metrics(client, keys, srv, metrics_port, metrics_addr)
    _run(lambda: srv.run(install_signals=True, wait_for_id=wait_for_id), client, keys)


def _run_async(
    fn: Callable[[Any], Any],
    redis_url: str,
    settings: Settings,
    client: redis.Redis,
    keys: QueueKeys,
    sid: str,
    workers: int,
    wait_for_id: float,
    cluster: bool | None,
    metrics_port: int | None,
    metrics_addr: str,
) -> None:
    """`worker` for an `async def` handler: an AsyncServer of `workers` concurrent workers."""
    if cluster_routing.is_cluster(client) or cluster:
        raise Failure(
            "an async def handler cannot serve a Redis Cluster yet: use a plain "
            "def handler (the threaded server) for a cluster"
        )
    try:
        aclient = connect_async(redis_url, settings)
        srv = AsyncServer(aclient, keys, sid, fn, workers=workers, settings=settings)
    except ValueError as exc:
        raise Failure(f"an async def handler: {exc}") from exc
    if metrics_port is not None:
        _serve_metrics(client, keys, srv.control, metrics_port, metrics_addr)

    async def serve() -> None:
        try:
            await srv.run(install_signals=True, wait_for_id=wait_for_id)
        finally:
            await aclient.aclose()

    _run(lambda: asyncio.run(serve()), client, keys)


def _serve_metrics(client: redis.Redis, keys: QueueKeys, srv: Server, port: int, addr: str) -> None:
    from ..ops.metrics import EXTRA_MESSAGE, Metrics

    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise Failure(EXTRA_MESSAGE) from exc
    try:
        Metrics(client, keys, srv).serve(port, addr)
    except OSError as exc:
        raise Failure(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
    logging.getLogger("taskcustody.metrics").info("metrics on http://%s:%d/metrics", addr, port)
