"""`taskcustody dead list | show ID | requeue [ID... | --all] | purge --yes` and
`taskcustody result ID` (the library's ops/deadletters.py and ops/results.py, on the command
line)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import click
import redis

from ..core.keys import QueueKeys
from ..deploy.connection import check_key_types, check_server
from ..deploy.redis_errors import reachable
from ..ops.deadletters import (
    DeadLetter,
    dead_letter,
    list_dead_letters,
    purge_dead_letters,
    requeue_dead_letters,
)
from ..ops.results import get_result
from .app import (
    _client,
    _keys,
    _run,
    _when,
    allow_evicting_option,
    prefix_option,
    queue_option,
    url_option,
)
from .errors import Failure, UsageFailure

T = TypeVar("T")


def _checked(client: redis.Redis, keys: QueueKeys, action: Callable[[], T]) -> T:
    """`action` with its errors mapped (cli._run), once a wrong URL or a key of the wrong type
    has been named."""

    def checked() -> T:
        reachable(client)
        check_key_types(client, keys)
        return action()

    result: T = _run(checked)
    return result


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "-"


def _payload_text(letter: DeadLetter, width: int = 60) -> str:
    data = letter.to_dict()
    text = json.dumps(data["payload"]) if "payload" in data else repr(letter.raw)
    return text if len(text) <= width else text[: width - 3] + "..."


@click.group()
def dead() -> None:
    """Dead letters: tasks whose handler failed --max-attempts times, and bytes in the queue that
    were not task envelopes."""


@dead.command("list")
@queue_option
@prefix_option
@url_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option(
    "--limit",
    default=None,
    type=click.IntRange(min=1),
    help="Show at most this many, newest first.",
)
def list_command(queue: str, prefix: str, redis_url: str, as_json: bool, limit: int | None) -> None:
    """List dead letters, newest first: task id, handler attempts, when, the error's last line,
    the payload (decoded when it is JSON)."""
    keys = _keys(queue, prefix)
    client = _client(redis_url)
    letters = _checked(client, keys, lambda: list_dead_letters(client, keys, limit))
    if as_json:
        click.echo(json.dumps([letter.to_dict() for letter in letters], indent=2))
        return
    if not letters:
        click.echo(f"no dead letters in queue {queue}")
        return
    for letter in letters:
        click.echo(
            f"{letter.task_id or '(no task id)'}  attempts={letter.attempts}  "
            f"at={_when(letter.at)}  error={_last_line(letter.error)}  "
            f"payload={_payload_text(letter)}"
        )


@dead.command()
@click.argument("task_id")
@queue_option
@prefix_option
@url_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def show(task_id: str, queue: str, prefix: str, redis_url: str, as_json: bool) -> None:
    """Show the dead letter of task TASK_ID: the whole error with the handler's traceback (its
    innermost frames, when it is very long), the attempts, the payload."""
    keys = _keys(queue, prefix)
    client = _client(redis_url)
    letter = _checked(client, keys, lambda: dead_letter(client, keys, task_id))
    data = letter.to_dict()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(
        f"task {task_id}: dead-lettered at {_when(letter.at)} after {letter.attempts} attempt(s)"
    )
    click.echo("error:")
    for line in (letter.error or "-").splitlines():
        click.echo(f"  {line}")
    if letter.traceback:
        click.echo("traceback:")
        for line in letter.traceback.splitlines():
            click.echo(f"  {line}")
    if "payload" in data:
        click.echo("payload:")
        click.echo(
            "\n".join(f"  {line}" for line in json.dumps(data["payload"], indent=2).splitlines())
        )
    else:
        click.echo(f"raw (not a task envelope): {letter.raw!r}")


@dead.command()
@click.argument("task_ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Requeue every dead letter.")
@queue_option
@prefix_option
@url_option
@allow_evicting_option
def requeue(
    task_ids: tuple[str, ...],
    every: bool,
    queue: str,
    prefix: str,
    redis_url: str,
    allow_evicting_policy: bool,
) -> None:
    """Move the dead letters of TASK_IDS (or --all) back to the queue, oldest first, behind the
    tasks already queued. Each keeps its task id; its attempt count is reset to 0, so it gets
    --max-attempts runs again. Each entry moves in one atomic step: interrupted, a requeue has
    moved every entry once or not at all. Entries that are not task envelopes stay put.

    A TASK_ID with no dead letter (already requeued or purged, or never dead-lettered) is named
    in one line on stderr and the exit status is 1; the other TASK_IDS are requeued all the same
    (stdout lists them). Requeueing the same id twice is therefore harmless: the second time
    moves nothing and says so."""
    if bool(task_ids) == every:
        raise UsageFailure("name the TASK_IDS to requeue, or pass --all (not both)")
    keys = _keys(queue, prefix)
    client = _client(redis_url)
    report = _run(
        lambda: (
            check_server(client, keys, allow_evicting_policy=allow_evicting_policy),
            requeue_dead_letters(client, keys, None if every else task_ids),
        )[1]
    )
    # An id asked for whose letter someone else requeued or purged between our read and our
    # move (report.gone) is in the same state as a missing one: no dead letter by that id now.
    settled = {*report.requeued, *(letter.task_id for letter in report.not_tasks)}
    absent = [t for t in dict.fromkeys(task_ids) if t not in settled]
    if report.requeued or every:
        click.echo(
            f"requeued {len(report.requeued)} task(s) to queue {queue}, attempts reset "
            "to 0" + (f": {' '.join(report.requeued)}" if report.requeued else "")
        )
    if report.not_tasks:
        click.echo(f"left {len(report.not_tasks)} dead letter(s) that are not task envelopes")
    if every and report.gone:
        click.echo(
            f"{report.gone} dead letter(s) were requeued or purged by someone else meanwhile"
        )
    if absent:
        which = (
            f"no dead letter with id {absent[0]}"
            if len(absent) == 1
            else f"no dead letters with ids {' '.join(absent)}"
        )
        others = "; the other id(s) were requeued" if report.requeued else ""
        raise Failure(
            f"{which} in queue {queue} (already requeued or purged, or never dead-lettered){others}"
        )


@dead.command()
@queue_option
@prefix_option
@url_option
@click.option("--yes", is_flag=True, help="Really delete every dead letter of the queue.")
def purge(queue: str, prefix: str, redis_url: str, yes: bool) -> None:
    """Delete every dead letter of the queue, for good (asks for --yes)."""
    keys = _keys(queue, prefix)
    if not yes:
        raise UsageFailure(f"purge deletes every dead letter of queue {queue} for good: add --yes")
    client = _client(redis_url)
    purged = _checked(client, keys, lambda: purge_dead_letters(client, keys))
    click.echo(f"purged {purged} dead letter(s) from queue {queue}")


@click.command()
@click.argument("task_id")
@queue_option
@prefix_option
@url_option
@click.option(
    "--timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to wait for the task to commit (0: look once).",
)
def result(task_id: str, queue: str, prefix: str, redis_url: str, timeout: float) -> None:
    """Wait for task TASK_ID to commit and print its result as JSON (null when the handler
    returned None). Exit 1 if the task was dead-lettered or the timeout passed first, and exit 1
    at once, without waiting, if no task of that id is anywhere in the queue (not queued,
    scheduled, in flight or dead-lettered, no result stored: never enqueued there, or its result
    expired). Results are kept for the worker's --result-ttl (one day by default)."""
    keys = _keys(queue, prefix)
    client = _client(redis_url)
    value = _checked(client, keys, lambda: get_result(client, keys, task_id, timeout))
    click.echo(json.dumps(value))
