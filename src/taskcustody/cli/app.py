"""The `taskcustody` command line (click: subcommands, --help and usage errors with exit 2)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import click
import redis

from ..core import recovery, scheduled
from ..core.clock import RedisClock
from ..core.errors import TaskCustodyError
from ..core.keys import QueueKeys
from ..core.producer import Producer
from ..core.recovery import ServerIdentity
from ..core.settings import Settings, SettingsError
from ..deploy import cluster as cluster_routing
from ..deploy.connection import check_server, connect
from ..ops.status import QueueStatus, queue_status
from .errors import Failure, MappedErrors, UsageFailure, as_click, check_url
from .handler_import import import_failure

DEFAULT_URL = "redis://127.0.0.1:6379/0"

queue_option = click.option("--queue", "-q", required=True, help="Queue name.")
prefix_option = click.option(
    "--prefix",
    default="taskcustody",
    show_default=True,
    help="Key prefix shared by every key of the queue.",
)
url_option = click.option(
    "--redis-url",
    default=DEFAULT_URL,
    show_default=True,
    envvar="TASKCUSTODY_REDIS_URL",
    help="Redis URL (or $TASKCUSTODY_REDIS_URL).",
)
cluster_option = click.option(
    "--cluster/--no-cluster",
    "cluster",
    default=None,
    help="Talk to a Redis Cluster (any node of it as --redis-url, a replica too), or to a single "
    "node. Default: ask the node (INFO cluster).",
)
allow_evicting_option = click.option(
    "--allow-evicting-policy",
    is_flag=True,
    help="Run even if Redis's maxmemory-policy is allkeys-* (it may evict a queue or an "
    "in-flight list under memory pressure, losing tasks). Warned once per process.",
)


def _keys(queue: str, prefix: str) -> QueueKeys:
    try:
        return QueueKeys(queue, prefix)
    except TaskCustodyError as exc:
        raise click.BadParameter(str(exc)) from exc


def replication_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--min-replicas / --replica-timeout (Settings.min_replicas, Settings.replica_timeout)."""
    fn = click.option(
        "--replica-timeout",
        default=1.0,
        show_default=True,
        type=click.FloatRange(min=0.001),
        help="Seconds a WAIT may wait for the replicas (must be shorter than the "
        "socket timeout, block timeout + 3 s).",
    )(fn)
    return click.option(
        "--min-replicas",
        default=0,
        show_default=True,
        type=click.IntRange(min=0),
        help="Replicas that must acknowledge each write (Redis WAIT, in the same "
        "round trip). Enqueue fails (exit 1) when fewer do; a worker logs "
        "and carries on. See docs/guides/failover.md.",
    )(fn)


registry_grace_option = click.option(
    "--registry-grace",
    default=Settings.registry_grace,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a dead, empty in-flight list stays registered before a sweep forgets it; "
    "must exceed the take's block timeout plus the socket margin.",
)


def _settings(**kwargs: Any) -> Settings:
    """Settings from the current command's options, each passed under the option's own name: a
    refusal names the flags the user typed (`--server-ttl must exceed --heartbeat-interval`), and
    a field no option of the command sets reads as its Settings name and fixed value
    (`socket_timeout_margin=3.0`). Usage: exit 2, before anything is asked of Redis."""
    try:
        return Settings(**kwargs)
    except SettingsError as exc:
        names = {field: f"{field}={value}" for field, value in exc.given.items()}
        raise click.UsageError(exc.render({**names, **option_flags(kwargs)})) from exc


def option_flags(fields: Any) -> dict[str, str]:
    """{Settings field: the flag of the current command's option of that name}, for `fields`."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return {}
    return {
        param.name: max(param.opts, key=len)
        for param in ctx.command.params
        if isinstance(param, click.Option) and param.name in fields
    }


def _client(url: str, settings: Settings | None = None, cluster: bool | None = None) -> redis.Redis:
    check_url(url)
    try:
        return _run(lambda: connect(url, settings, cluster=cluster))  # type: ignore[no-any-return]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--redis-url") from exc


def load_handler(spec: str) -> Callable[[Any], Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(f"{spec!r} is not MODULE:FUNCTION", param_hint="HANDLER")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `rq worker` does: the handler may live here
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's code ran: whatever it raised is theirs to fix
        # One line naming the file and line (handler_import.py), not click's and importlib's
        # traceback; exit 2, as for every error found before Redis is asked.
        raise UsageFailure(import_failure(module_name, exc)) from exc
    handler = getattr(module, attr, None)
    if not callable(handler):
        where = getattr(module, "__file__", None) or module_name
        raise UsageFailure(f"handler module {module_name!r} ({where}) has no callable {attr!r}")
    return handler  # type: ignore[no-any-return]


_Failure = Failure  # a runtime failure: exit 1 with one line (errors.py)


def _where(client: redis.Redis | None, keys: QueueKeys | None) -> str:
    """` (slot N on host:port)` for a cluster client, ` (host:port)` otherwise."""
    if client is None or keys is None:
        return ""
    try:
        return f" ({cluster_routing.route(client, keys.queue)})"
    except (redis.RedisError, redis.exceptions.RedisClusterException):
        return ""


def _run(
    action: Callable[[], Any], client: redis.Redis | None = None, keys: QueueKeys | None = None
) -> Any:
    """Run a command's work, its errors mapped to one line and an exit code (errors.py);
    a cluster's redirects and resharding name the slot and its node."""
    try:
        return action()
    except redis.exceptions.MovedError as exc:
        # A single-node client (--no-cluster) pointed at a node that does not serve the slot.
        raise _Failure(
            f"slot {exc.slot_id} is served by {exc.host}:{exc.port}, not by the node of "
            f"--redis-url{_where(client, keys)}: this is a Redis Cluster; drop --no-cluster (a "
            "cluster client follows the slot map) or point --redis-url at that node"
        ) from exc
    except (
        redis.exceptions.AskError,
        redis.exceptions.TryAgainError,
        redis.exceptions.ClusterDownError,
    ) as exc:
        raise _Failure(
            f"the cluster is resharding or healing{_where(client, keys)}: {exc}; retry in a moment"
        ) from exc
    except redis.exceptions.RedisClusterException as exc:
        raise _Failure(f"Redis Cluster error{_where(client, keys)}: {exc}") from exc
    except Exception as exc:
        mapped = as_click(exc)
        if mapped is None:
            raise
        raise mapped from exc


# `dead` and `result` live in dead.py, which imports this module's options: loaded when used.
@click.group(
    cls=MappedErrors,
    context_settings={"help_option_names": ["-h", "--help"]},
    lazy_commands={
        "dead": "taskcustody.cli.dead:dead",
        "result": "taskcustody.cli.dead:result",
        # the verify extra's command, or a stand-in naming the extra
        "verify": "taskcustody.cli.verify:verify_command",
    },
)
@click.version_option(package_name="taskcustody")
def main() -> None:
    """A Redis task queue that never loses a task and never hands one task to two workers."""


@main.command()
@queue_option
@prefix_option
@url_option
@allow_evicting_option
@replication_options
@cluster_option
@click.option(
    "--quiet",
    is_flag=True,
    help="Print only the number of tasks enqueued, at the end, instead of their ids.",
)
@click.argument("payloads", nargs=-1, required=True)
def enqueue(
    queue: str,
    prefix: str,
    redis_url: str,
    allow_evicting_policy: bool,
    min_replicas: int,
    replica_timeout: float,
    cluster: bool | None,
    quiet: bool,
    payloads: tuple[str, ...],
) -> None:
    """Enqueue JSON PAYLOADS, or with `-` one JSON payload per line of stdin (blank lines skipped).

    Prints each task's id, one per line, as soon as Redis holds it (--quiet: only the count, at
    the end): the ids printed are exactly the tasks enqueued, however the command ends.

    Payloads given as arguments are all parsed first: one bad payload enqueues nothing. stdin is
    streamed, 500 lines at a time, each batch one LPUSH (Redis runs all of it or none of it), and
    the command stops only between two batches:

    \b
    - a line that is not JSON: the lines before it are enqueued, it and
      the lines after it are not (exit 2);
    - Ctrl-C (SIGINT) or SIGTERM: a batch already sent to Redis is finished
      and printed, nothing after it is enqueued (exit 130; 143 for SIGTERM);
    - stdout closed (`| head`): nothing more is enqueued (exit 141).

    Each of these says on stderr, in one line, how many tasks were enqueued, the last one's id and
    the stdin line it came from: to carry on, feed the input from the line after that one
    (`tail -n +N`).

    With --min-replicas, a WAIT that returns short exits 1: the batch stays in the primary's queue
    and its ids are printed too (enqueueing them again may run them twice).
    """
    from typing import BinaryIO

    from .enqueue import Payload, StopSignals, Stream, parse

    settings = _settings(min_replicas=min_replicas, replica_timeout=replica_timeout)
    sources: list[Payload | BinaryIO] = []
    for number, item in enumerate(payloads, 1):
        if item == "-":
            sources.append(sys.stdin.buffer)
            continue
        try:
            sources.append(parse(item, f"payload {number}"))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="PAYLOADS") from exc
    keys = _keys(queue, prefix)
    signals = StopSignals()
    stream = Stream(signals, quiet=quiet)
    with signals.installed(), stream.stopping():
        client = _client(redis_url, settings, cluster)
        producer = _run(
            lambda: (
                check_server(client, keys, allow_evicting_policy=allow_evicting_policy),
                Producer(client, keys, settings=settings),
            )[1],
            client,
            keys,
        )
        stream.enqueue(sources, producer, lambda action: _run(action, client, keys))


def _when(at: float | None, now: float | None = None) -> str:
    """A time in epoch seconds (a server's deadline, a dead letter's) as people read it: ISO 8601
    in UTC to the second and, given `now` (the same clock's), how far from it:
    `2026-12-05T21:10:00Z (in 12 s)`, `... (3 s ago)`. `-` for no time at all. (`--json` output
    keeps the number: a program compares it, a person reads this.)"""
    if at is None:
        return "-"
    text = datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if now is None:
        return text
    return f"{text} ({_span(at - now)})"


def _span(delta: float) -> str:
    """`in 12 s` / `3 s ago` / `now`, in the largest unit that still counts two of it (a status
    shows a deadline seconds away; a dead letter may be days old)."""
    seconds = round(abs(delta))
    if seconds == 0:
        return "now"
    amount = f"{seconds} s"
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= 2 * size:
            amount = f"{round(seconds / size)} {unit}"
            break
    return f"in {amount}" if delta > 0 else f"{amount} ago"


@main.command()
@queue_option
@prefix_option
@url_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the status as JSON (deadlines as epoch seconds of the server's clock).",
)
@allow_evicting_option
@cluster_option
def status(
    queue: str,
    prefix: str,
    redis_url: str,
    as_json: bool,
    allow_evicting_policy: bool,
    cluster: bool | None,
) -> None:
    """Show queue depth, in-flight tasks per server and worker, servers, records, dead letters."""
    keys = _keys(queue, prefix)
    client = _client(redis_url, cluster=cluster)

    # Refused like the other commands: a queue on an evicting server (or too old a Redis, or a
    # key of the wrong type) is one to fix, not to watch. (The version, the policy and the clock
    # are those of the node that owns the queue's slot.) Deadlines are shown against that clock.
    def read() -> tuple[QueueStatus, float]:
        check_server(client, keys, allow_evicting_policy=allow_evicting_policy)
        now = RedisClock(client, key=keys.queue).now()
        return queue_status(client, keys, now), now

    snap, now = _run(read, client, keys)
    if as_json:
        click.echo(json.dumps(snap.to_dict(), indent=2, sort_keys=True))
        return
    click.echo(
        f"queue {snap.queue}: {snap.depth} pending, {snap.committed} committed, "
        f"{snap.processing} processing records, {snap.dead_letters} dead letters, "
        f"{snap.suspects} suspects, {snap.scheduled} scheduled retries"
    )
    if not snap.servers:
        click.echo("no registered servers")
    for name, info in sorted(snap.servers.items()):
        state = "registered" if info["registered"] else "expired"
        click.echo(
            f"server {name} (incarnation {info['incarnation']}): {state}, "
            f"deadline {_when(info['deadline'], now)}"
        )
    for owner, per_worker in sorted(snap.inflight.items()):
        held = ", ".join(f"{w}={n}" for w, n in sorted(per_worker.items()))
        click.echo(f"in flight {owner}: {held}")


@main.command()
@queue_option
@prefix_option
@url_option
@allow_evicting_option
@registry_grace_option
@cluster_option
def sweep(
    queue: str,
    prefix: str,
    redis_url: str,
    allow_evicting_policy: bool,
    registry_grace: float,
    cluster: bool | None,
) -> None:
    """Run one recovery pass: prune expired servers, forget their empty in-flight lists once
    the grace has passed, drain the others, requeue stuck processing records. Never touches a
    live server's lists."""
    # The grace is checked as a worker's would be (finite, bounded, longer than a take's block):
    # a NaN or infinite grace would otherwise reach the sweep as a comparison that never holds.
    registry_grace = _settings(registry_grace=registry_grace).registry_grace
    keys = _keys(queue, prefix)
    client = _client(redis_url, cluster=cluster)
    # The CLI holds no server id of its own: nothing is "self" here.
    me = ServerIdentity("taskcustody-cli", 0)
    clock = RedisClock(client, key=keys.queue)
    report, promoted = _run(
        lambda: (
            check_server(client, keys, allow_evicting_policy=allow_evicting_policy),
            recovery.sweep(client, keys, clock.now(), me, grace=registry_grace),
            scheduled.promote(client, keys, clock.now()),
        )[1:],
        client,
        keys,
    )
    click.echo(
        f"pruned {len(report.pruned)} server(s) {report.pruned}; forgot "
        f"{len(report.forgotten_lists)} dead empty list(s); requeued "
        f"{report.moved} task(s) from {len(report.drained_lists)} list(s); "
        f"{report.requeued_stuck} stuck, {report.stale_records} stale record(s); "
        f"promoted {promoted} due retr{'y' if promoted == 1 else 'ies'}"
    )


def _mount_optional() -> None:
    """Commands that live in other packages of the distribution."""
    try:
        from taskcustody_model.cli import model_check  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # pragma: no cover - the model ships with the package
        return
    main.add_command(model_check, name="model-check")


_mount_optional()


if __name__ == "__main__":
    main()


# The worker command lives in its own module; importing it registers it on `main`.
from . import worker as _worker  # noqa: E402,F401
