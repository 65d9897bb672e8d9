"""`taskcustody verify`: the model check, then the model-driven stateful run, then a report.

Exit status: 0 every property held; 1 a property was violated (the counterexample is printed, with
the command that reproduces it) -- with `--variant NAME` that is the expected outcome: the broken
design was caught; 2 usage errors (and a Redis that cannot be reached).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import redis
from taskcustody_model import Progress
from taskcustody_model.variants import variant_listing

from .deployment import DeploymentError, deployment_error, describe
from .designs import CHOICES
from .machine import RunStats
from .report import html_report, text_report
from .run import Options, default_examples, verify


class _Progress:
    """One progress line on stderr (rewritten in place on a terminal), stdout stays the report's."""

    def __init__(self, quiet: bool, examples: int) -> None:
        self.quiet = quiet
        self.examples = examples
        self.tty = sys.stderr.isatty()
        self.started = time.perf_counter()
        self.last = 0.0
        self.phase = ""

    def _emit(self, text: str, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.perf_counter()
        if not force and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        if self.tty:
            sys.stderr.write("\r\x1b[K" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def on_phase(self, phase: str) -> None:
        self.end()
        self.phase = phase
        self.started = time.perf_counter()
        self._emit(f"{phase}...", force=True)

    def on_model(self, p: Progress) -> None:
        self._emit(f"model check: {p.distinct_states:,} states, depth {p.depth}, "
                   f"{p.seconds:.0f} s")

    def on_example(self, s: RunStats) -> None:
        secs = time.perf_counter() - self.started
        self._emit(f"stateful run: {s.examples:,} examples (of {self.examples:,} + shrinking), "
                   f"{s.steps:,} steps, {sum(s.faults.values()):,} faults, {secs:.0f} s")

    def end(self) -> None:
        if not self.quiet and self.tty and self.phase:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _check_reachable(url: str) -> None:
    from ..connection import check_version, connect
    from ..errors import RedisTooOld
    from .harness import VERIFY_SETTINGS

    try:
        client = connect(url, VERIFY_SETTINGS)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--redis-url") from exc
    try:
        # Before any work: a server below the floor is named and refused (exit 2, like an
        # unreachable one), not counted as a violation of the protocol.
        check_version(client)
    except RedisTooOld as exc:
        raise click.BadParameter(str(exc), param_hint="--redis-url") from exc
    except redis.RedisError as exc:
        raise click.BadParameter(f"cannot reach {url}: {exc}", param_hint="--redis-url") from exc
    finally:
        client.close()


def _deployment_failed(message: str) -> None:
    """Exit 2: the deployment stopped the run; nothing was found about the protocol."""
    click.echo(f"Error: {message}", err=True)
    click.echo("No property was checked to the end: this is not a violation.", err=True)
    sys.exit(2)


@click.command(name="verify")
@click.option("--examples", type=click.IntRange(1, 1_000_000), default=None,
              show_default="200; 300-600 for a --variant whose derandomized search needs more",
              help="Stateful examples (runs from a fresh deployment) to generate.")
@click.option("--steps", type=click.IntRange(1, 10_000), default=40, show_default=True,
              help="Maximum steps per stateful example.")
@click.option("--seed", type=int, default=None,
              help="Explore with this random seed (default: derandomized, the same every run).")
@click.option("--variant", default="correct", show_default=True, metavar="NAME",
              help="Verify a broken design instead of the real one; 'list' names them.")
@click.option("--redis-url", default=None, metavar="URL",
              help="Run the stateful part against this Redis (default: in-process fakeredis). "
                   "It writes only keys under taskcustody-verify:{verify-<pid>}: and deletes "
                   "them at the end.")
@click.option("--report", "report_file", type=click.Path(dir_okay=False, writable=True,
                                                         path_type=Path),
              default=None, help="Also write the run as a self-contained HTML page.")
@click.option("--model-check/--no-model-check", default=True, show_default=True,
              help="Run the bounded model check.")
@click.option("--stateful/--no-stateful", default=True, show_default=True,
              help="Run the model-driven stateful run on the implementation.")
@click.option("--shrink-seconds", type=click.FloatRange(1, 3600), default=60.0,
              show_default=True, help="Time budget for shrinking a counterexample.")
@click.option("--prefetch", is_flag=True,
              help="Also drive the prefetching worker (Settings.prefetch > 1): a process's "
                   "workers take, and release, in one pipeline, with a reply lost at any slot.")
@click.option("--queue", "-q", default=None, metavar="NAME",
              help="With --redis-url: the queue name (hash tag) of the run's keys, instead of "
                   "verify-<pid>. On a Redis Cluster it picks the slot, so the master, the run "
                   "happens on.")
@click.option("--quiet", is_flag=True,
              help="No progress on stderr. (No short form: -q is --queue in every command.)")
def verify_command(examples: int | None, steps: int, seed: int | None, variant: str,
                   redis_url: str | None, report_file: Path | None, model_check: bool,
                   stateful: bool, shrink_seconds: float, prefetch: bool, queue: str | None,
                   quiet: bool) -> None:
    """Verify the custody protocol: the bounded model check, then the model drives the real
    implementation step by step with faults injected (dropped replies, worker and server
    crashes, stalls, clock moves), comparing Redis with the model after every step.

    Exit status: 0 verified; 1 a property was violated (with --variant: the broken design was
    caught, as it should be; its counterexample is printed as numbered steps); 2 usage errors,
    or the deployment stopped the run (Redis unreachable, a cluster redirect, a key of the
    wrong type): never reported as a violation.
    """
    if variant == "list":
        click.echo(variant_listing())
        return
    if variant not in CHOICES:
        raise click.BadParameter(
            f"unknown design {variant!r} (known: {', '.join(CHOICES)}; see --variant list)",
            param_hint="--variant")
    if not model_check and not stateful:
        raise click.UsageError("--no-model-check and --no-stateful: nothing to run")
    if examples is None:
        examples = default_examples(variant)
    if queue is not None:
        from ..keys import QueueKeys

        try:
            QueueKeys(queue)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--queue") from exc
    options = Options(examples=examples, steps=steps, seed=seed, variant=variant,
                      redis_url=redis_url, model_check=model_check, stateful=stateful,
                      shrink_seconds=shrink_seconds, prefetch=prefetch, queue=queue)
    if redis_url is not None:
        _check_reachable(redis_url)
    progress = _Progress(quiet, examples)
    try:
        result = verify(options, on_model=progress.on_model, on_example=progress.on_example,
                        on_phase=progress.on_phase)
    except DeploymentError as exc:
        _deployment_failed(str(exc))
    except Exception as exc:
        cause = deployment_error(exc)
        if cause is None:
            raise
        _deployment_failed(f"the run was stopped by the deployment: {describe(cause)}")
    finally:
        progress.end()
    click.echo(text_report(result))
    if report_file is not None:
        report_file.write_text(html_report(result), encoding="utf-8")
        click.echo(f"report written to {report_file}")
    if result.ok and variant != "correct":
        click.echo(f"note: the broken design {variant!r} was NOT caught within these bounds",
                   err=True)
    sys.exit(0 if result.ok else 1)
