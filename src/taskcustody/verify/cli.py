"""`taskcustody verify`: the model check, then the model-driven stateful run, then a report.

Exit status: 0 every property held; 1 a property was violated (the counterexample is printed, with
the command that reproduces it) -- with `--variant NAME` that is the expected outcome: the broken
design was caught; 2 usage errors (and a Redis that cannot be reached).

For CI: `--junit-xml FILE` writes the run as JUnit XML (junit.py), `--max-seconds N` stops it
cleanly when N seconds are spent (budget.py); a run cut short that found nothing exits 0 and says
"PARTIAL" with what it covered.

stdout is the report's; stderr is verify's progress. The protocol's own log lines (the warnings
and errors the injected faults make it log) are counted by kind in the report
(verify/protocol_log.py), and printed on stderr as well only with `-v`; `--quiet` leaves stderr
empty unless the run ends in an error.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import click
import redis
from taskcustody_model import Progress
from taskcustody_model.variants import variant_listing

from .budget import Budget, Clock
from .coverage import coverage_text, with_coverage
from .designs import CHOICES
from .embedded import (
    SERVER_BINARY_VARIABLE,
    NoServerBinary,
    RedisServerProcess,
    redis_server_binary,
)
from .junit import junit_xml
from .machine import RunStats
from .report import text_report
from .report_html import html_report
from .run import (
    Options,
    QueueInUse,
    Result,
    default_examples,
    load_settings,
    stopped_by_deployment,
    verify,
)

#: The time budget's clock (tests replace it: a budget must not depend on how fast a machine is).
CLOCK: Clock = time.monotonic


class _Progress:
    """One progress line on stderr (rewritten in place on a terminal), stdout stays the report's.
    With `-v`, the protocol's own log lines too (`log`), each on a line of its own."""

    def __init__(self, quiet: bool, examples: int) -> None:
        self.quiet = quiet
        self.examples = examples
        self.tty = sys.stderr.isatty()
        self.started = time.perf_counter()
        self.last = 0.0
        self.phase = ""
        self.shown = ""  # the progress line on a terminal's last line (rewritten in place)

    def _emit(self, text: str, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.perf_counter()
        if not force and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        if self.tty:
            sys.stderr.write("\r\x1b[K" + text)
            self.shown = text
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def log(self, line: str) -> None:
        """A line of the protocol's log (`verify -v`): above the progress line, which a
        terminal shows again under it."""
        if self.tty and self.shown:
            sys.stderr.write("\r\x1b[K" + line + "\n" + self.shown)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def on_phase(self, phase: str) -> None:
        self.end()
        self.phase = phase
        self.started = time.perf_counter()
        self._emit(f"{phase}...", force=True)

    def on_model(self, p: Progress) -> None:
        self._emit(f"model check: {p.distinct_states:,} states, depth {p.depth}, {p.seconds:.0f} s")

    def on_example(self, s: RunStats) -> None:
        secs = time.perf_counter() - self.started
        self._emit(
            f"stateful run: {s.examples:,} examples (of {self.examples:,} + shrinking), "
            f"{s.steps:,} steps, {sum(s.faults.values()):,} faults, {secs:.0f} s"
        )

    def end(self) -> None:
        if not self.quiet and self.tty and self.phase:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.shown = ""


def _check_reachable(url: str, option: str = "--redis-url") -> None:
    from ..core.errors import RedisTooOld
    from ..deploy.connection import check_version, connect
    from .harness import VERIFY_SETTINGS

    try:
        client = connect(url, VERIFY_SETTINGS)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from exc
    try:
        # Before any work: a server below the floor is named and refused (exit 2, like an
        # unreachable one), not counted as a violation of the protocol.
        check_version(client)
    except RedisTooOld as exc:
        raise click.BadParameter(str(exc), param_hint=option) from exc
    except redis.RedisError as exc:
        raise click.BadParameter(f"cannot reach {url}: {exc}", param_hint=option) from exc
    finally:
        client.close()


def _max_seconds(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds) or seconds <= 0:
        raise click.BadParameter(f"{value!r} is not a number of seconds > 0")
    return seconds


def _report_path(path: Path, variant: str, several: bool) -> Path:
    """With several designs, one HTML page each: FILE's name with the design's before its suffix."""
    return path.with_name(f"{path.stem}-{variant}{path.suffix}") if several else path


def _deployment_failed(message: str) -> NoReturn:
    """Exit 2: the deployment stopped the run; nothing was found about the protocol."""
    click.echo(f"Error: {message}", err=True)
    click.echo("No property was checked to the end: this is not a violation.", err=True)
    sys.exit(2)


@contextlib.contextmanager
def _embedded_server(wanted: bool) -> Iterator[str | None]:
    """`--embedded-redis`: a throwaway redis-server's URL (embedded.py), stopped by pid when the
    run ends; None when not wanted. Without a server to start: one line, exit 2."""
    if not wanted:
        yield None
        return
    try:
        binary = redis_server_binary()
    except NoServerBinary as exc:
        _no_server(str(exc))
    if binary is None:
        _no_server(
            f"no redis-server on PATH and no ${SERVER_BINARY_VARIABLE}: install Redis, "
            "or run on your own Redis with --redis-url URL"
        )
    try:
        server = RedisServerProcess(binary=binary).start()
    except (RuntimeError, OSError) as exc:
        _no_server(f"cannot start {binary}: {str(exc).strip()}")
    try:
        yield server.url
    finally:
        server.stop()


def _no_server(message: str) -> NoReturn:
    click.echo(f"Error: --embedded-redis: {message}", err=True)
    sys.exit(2)


@click.command(name="verify")
@click.option(
    "--examples",
    type=click.IntRange(1, 1_000_000),
    default=None,
    show_default="200; 300-600 for a --variant whose pinned search needs more",
    help="Stateful examples (runs from a fresh deployment) to generate.",
)
@click.option(
    "--steps",
    type=click.IntRange(1, 10_000),
    default=40,
    show_default=True,
    help="Maximum steps per stateful example.",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Explore with this random seed (default: 0, the same every run).",
)
@click.option(
    "--variant",
    "variants",
    multiple=True,
    metavar="NAME",
    help="Verify a broken design instead of the real one (default: correct); 'list' "
    "names them. Repeat it to run several designs, one after the other.",
)
@click.option(
    "--redis-url",
    default=None,
    metavar="URL",
    help="Run the stateful part against this Redis (default: in-process fakeredis). "
    "It writes only keys under taskcustody-verify:{verify-<pid>}: and deletes "
    "them at the end.",
)
@click.option(
    "--embedded-redis",
    is_flag=True,
    help="Run the stateful part on a throwaway redis-server (from PATH, or "
    "$TASKCUSTODY_REDIS_SERVER) on a free port of 127.0.0.1, stopped at the end: "
    "it sees what fakeredis cannot (the report of a fakeredis run lists what).",
)
@click.option(
    "--report",
    "report_file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Also write the run as a self-contained HTML page.",
)
@click.option(
    "--model-check/--no-model-check",
    default=True,
    show_default=True,
    help="Run the bounded model check.",
)
@click.option(
    "--stateful/--no-stateful",
    default=True,
    show_default=True,
    help="Run the model-driven stateful run on the implementation.",
)
@click.option(
    "--shrink-seconds",
    type=click.FloatRange(1, 3600),
    default=60.0,
    show_default=True,
    help="Time budget for shrinking a counterexample.",
)
@click.option(
    "--loops/--no-loops",
    default=True,
    show_default=True,
    help="With the real implementation: also run the worker's production loop "
    "(Worker.run) driven by the model, every command it sends checked to be a "
    "step the model allows then.",
)
@click.option(
    "--fault-coverage/--no-fault-coverage",
    default=True,
    show_default=True,
    help="Also the fault-coverage part: the stateful machine aims at every fault "
    "kind, and the run fails (with the counts) if a kind, or the lost reply of "
    "a command that can lose one, fires fewer times than its minimum.",
)
@click.option(
    "--prefetch",
    is_flag=True,
    help="Also drive the prefetching worker (Settings.prefetch > 1): a process's "
    "workers take, and release, in one pipeline, with a reply lost at any slot.",
)
@click.option(
    "--async",
    "asyncio_worker",
    is_flag=True,
    help="Drive the asyncio worker (taskcustody.aio.AsyncWorker) instead of the "
    "threaded one: the same steps and checks, with cancellations (a step "
    "cancelled with its reply in flight) among the faults; with --prefetch, "
    "its pipelines are the asyncio prefetching worker's.",
)
@click.option(
    "--queue",
    "-q",
    default=None,
    metavar="NAME",
    help="With --redis-url: the queue name (hash tag) of the run's keys, instead of "
    "verify-<pid>. On a Redis Cluster it picks the slot, so the master, the run "
    "happens on.",
)
@click.option(
    "--settings",
    "settings_spec",
    default=None,
    metavar="MODULE:ATTR",
    help="Your taskcustody Settings (an attribute of an importable module): the "
    "stateful run uses its connection, replication and eviction fields; the "
    "protocol's timing stays the model's.",
)
@click.option(
    "--junit-xml",
    "junit_file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write the run as JUnit XML for CI: one test case per part (model "
    "check, stateful conformance) and design; a violation is a failure with the "
    "counterexample, a part the time budget did not reach is skipped.",
)
@click.option(
    "--max-seconds",
    callback=_max_seconds,
    default=None,
    metavar="N",
    help="A time budget: stop cleanly once N seconds are spent (between parts, "
    "model-check progress reports and stateful examples) and say how much was "
    "covered. A run cut short that found nothing exits 0 and says PARTIAL. A "
    "counterexample found is still shrunk (--shrink-seconds).",
)
@click.option(
    "--quiet",
    is_flag=True,
    help="Nothing on stderr unless the run ends in an error (a violation, a usage "
    "or deployment error, a broken --variant not caught): no progress. (No short "
    "form: -q is --queue in every command.)",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Also print the protocol's own log lines (warnings and errors: what the "
    "injected faults make it log, e.g. 'lost custody', 'poison pill') on stderr "
    "as they come. Without it they are only counted, by kind, in the report.",
)
def verify_command(
    examples: int | None,
    steps: int,
    seed: int | None,
    variants: Sequence[str],
    redis_url: str | None,
    embedded_redis: bool,
    report_file: Path | None,
    model_check: bool,
    stateful: bool,
    shrink_seconds: float,
    loops: bool,
    fault_coverage: bool,
    prefetch: bool,
    asyncio_worker: bool,
    queue: str | None,
    settings_spec: str | None,
    junit_file: Path | None,
    max_seconds: float | None,
    quiet: bool,
    verbose: bool,
) -> None:
    """Verify the custody protocol: the bounded model check, then the model drives the real
    implementation step by step with faults injected (dropped replies, worker and server
    crashes, stalls, clock moves), comparing Redis with the model after every step.

    Exit status: 0 verified; 1 a property was violated (with --variant: the broken design was
    caught, as it should be; its counterexample is printed as numbered steps); 2 usage errors,
    or the deployment stopped the run (Redis unreachable, a cluster redirect, a key of the
    wrong type, a --queue that holds keys already): never reported as a violation. A run that
    --max-seconds cut short exits 0 if nothing failed in what it covered, and says PARTIAL.

    stderr: verify's progress; the protocol's own log lines (what the injected faults make it
    log) are counted in the report instead, and printed with -v. --quiet: nothing on stderr
    unless the run ends in an error.
    """
    if "list" in variants:
        click.echo(variant_listing())
        return
    for variant in variants:
        if variant not in CHOICES:
            raise click.BadParameter(
                f"unknown design {variant!r} (known: {', '.join(CHOICES)}; see --variant list)",
                param_hint="--variant",
            )
    variants = list(dict.fromkeys(variants)) or ["correct"]
    if not model_check and not stateful:
        raise click.UsageError("--no-model-check and --no-stateful: nothing to run")
    if quiet and verbose:
        raise click.UsageError("--quiet and --verbose: pick one")
    if queue is not None:
        from ..core.keys import QueueKeys

        try:
            QueueKeys(queue)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--queue") from exc
    user_settings = None
    if settings_spec is not None:
        try:
            user_settings = load_settings(settings_spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--settings") from exc
    if embedded_redis and redis_url is not None:
        raise click.UsageError("--embedded-redis and --redis-url: pick one server")
    said_loops = click.get_current_context().get_parameter_source("loops")
    if asyncio_worker and loops and said_loops is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError(
            "--async: the production-loops part drives the threaded "
            "worker's loop only (left out with --async): drop --loops"
        )
    if asyncio_worker and any(v != "correct" for v in variants):
        raise click.UsageError(
            "--async drives the asyncio worker of the correct design; the "
            "broken designs' demonstrations are threaded: drop --variant"
        )
    results: list[Result] = []
    with _embedded_server(embedded_redis and stateful) as embedded_url:
        redis_url = embedded_url or redis_url
        if redis_url is not None:
            _check_reachable(redis_url, "--embedded-redis" if embedded_url else "--redis-url")
        budget = Budget(max_seconds, CLOCK)
        for variant in variants:
            n = examples if examples is not None else default_examples(variant)
            options = Options(
                examples=n,
                steps=steps,
                seed=seed,
                variant=variant,
                redis_url=redis_url,
                model_check=model_check,
                stateful=stateful,
                shrink_seconds=shrink_seconds,
                prefetch=prefetch,
                queue=queue,
                loops=loops,
                fault_coverage=fault_coverage and stateful,
                asyncio=asyncio_worker,
                settings=user_settings,
                settings_spec=settings_spec,
                embedded=embedded_url is not None,
            )
            results.append(_run(options, budget, quiet, verbose))
            _print(results[-1], len(results) > 1, report_file, len(variants) > 1)
    if junit_file is not None:
        junit_file.write_text(junit_xml(results, text_report, max_seconds), encoding="utf-8")
        click.echo(f"JUnit XML written to {junit_file}")
    sys.exit(0 if all(r.ok for r in results) else 1)


def _print(result: Result, after_another: bool, report_file: Path | None, several: bool) -> None:
    """One design's report: the text, what it covered, its HTML page."""
    if after_another:
        click.echo("")
    click.echo(text_report(result))
    click.echo(coverage_text(result))
    variant = result.options.variant
    if report_file is not None:
        page = _report_path(report_file, variant, several)
        page.write_text(with_coverage(html_report(result), result), encoding="utf-8")
        click.echo(f"report written to {page}")
    if result.ok and not result.partial and variant != "correct":
        click.echo(
            f"note: the broken design {variant!r} was NOT caught within these bounds", err=True
        )


def _run(options: Options, budget: Budget, quiet: bool, verbose: bool) -> Result:
    """One design's run; a deployment that stops it, or a queue in use, exits 2. The protocol's
    log lines are the report's (run.verify); on stderr only with -v."""
    progress = _Progress(quiet, options.examples)
    try:
        return verify(
            options,
            on_model=progress.on_model,
            on_example=progress.on_example,
            on_phase=progress.on_phase,
            on_log=progress.log if verbose else None,
            budget=budget,
        )
    except QueueInUse as exc:
        raise click.BadParameter(str(exc), param_hint="--queue") from exc
    except Exception as exc:
        message = stopped_by_deployment(exc)
        if message is None:
            raise
        _deployment_failed(message)
    finally:
        progress.end()
