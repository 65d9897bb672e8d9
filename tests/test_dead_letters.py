"""Dead letters: list, show, requeue (one atomic step per entry) and purge, library and CLI."""

from __future__ import annotations

import base64
import json
from collections import Counter

import pytest
import redis
from click.testing import CliRunner

from taskcustody import (
    DeadLetterNotFound,
    ManualClock,
    Producer,
    QueueKeys,
    dead_letter,
    list_dead_letters,
    purge_dead_letters,
    requeue_dead_letters,
)
from taskcustody.cli.app import main
from taskcustody.core.envelope import decode
from taskcustody.ops.deadletters import parse, requeue_one
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits, ids_in, make_server
from tests.support.redis_server import RedisServerProcess


def fail(payload: object) -> None:
    raise ValueError(f"cannot handle {payload!r}")


def dead_letter_tasks(client: redis.Redis, keys: QueueKeys, payloads: list[object]) -> list[str]:
    """Each payload's task fails max_attempts times and is dead-lettered, in this order."""
    clock = ManualClock()
    ids = [Producer(client, keys, clock).enqueue(p) for p in payloads]
    (worker,) = make_server(client, keys, "dl", clock, fail).start()
    try:
        while worker.run_once(timeout=0.05):
            pass
    finally:
        worker.close()
    assert client.llen(keys.dead_letters) == len(payloads)
    return ids


def test_list_shows_the_error_the_attempts_and_the_decoded_payload_newest_first(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    first, second = dead_letter_tasks(client, keys, [{"n": 1}, {"n": 2}])
    client.lpush(keys.queue, b"\xff not json")
    (worker,) = make_server(client, keys, "s1", ManualClock()).start()
    assert worker.run_once(timeout=0.05) is False  # the malformed one, dead-lettered at once
    worker.close()
    malformed, newer, older = list_dead_letters(client, keys)
    assert (newer.task_id, older.task_id) == (second, first)
    assert newer.attempts == TEST_SETTINGS.max_attempts
    assert "ValueError: cannot handle {'n': 2}" in newer.error
    assert newer.to_dict()["payload"] == {"n": 2}
    assert malformed.task_id is None and malformed.attempts == 0
    assert not malformed.requeueable
    assert malformed.to_dict()["raw_base64"]  # not UTF-8: shown as base64
    assert [d.task_id for d in list_dead_letters(client, keys, limit=1)] == [None]


def test_show_finds_a_dead_letter_by_task_id(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    _, wanted, _ = dead_letter_tasks(client, keys, ["a", "b", "c"])
    letter = dead_letter(client, keys, wanted)
    assert letter.task_id == wanted and letter.task is not None
    assert letter.task.payload == "b"
    with pytest.raises(DeadLetterNotFound, match="no dead letter of task nope"):
        dead_letter(client, keys, "nope")


def test_requeue_keeps_the_id_resets_attempts_and_queues_behind_waiting_tasks(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    (failed,) = dead_letter_tasks(client, keys, ["x"])
    waiting = Producer(client, keys).enqueue("already waiting")
    report = requeue_dead_letters(client, keys, [failed])
    assert report.requeued == [failed] and report.missing == []
    assert client.llen(keys.dead_letters) == 0
    # The take end is the right: the waiting task is taken first, the requeued one after it.
    assert ids_in(client, keys.queue) == [failed, waiting]
    requeued = decode(client.lindex(keys.queue, 0))  # type: ignore[arg-type]
    assert (requeued.id, requeued.attempts, requeued.payload) == (failed, 0, "x")
    # It gets max_attempts runs again and, with a handler that now works, commits once.
    (worker,) = make_server(client, keys, "s2", ManualClock()).start()
    while worker.run_once(timeout=0.05):
        pass
    worker.close()
    assert commits(client, keys) == {waiting: 1, failed: 1}


def test_requeue_all_moves_oldest_first_and_reports_unknown_ids(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    ids = dead_letter_tasks(client, keys, [1, 2, 3])
    assert requeue_dead_letters(client, keys, ["nope", ids[1]]).missing == ["nope"]
    report = requeue_dead_letters(client, keys)
    assert report.requeued == [ids[0], ids[2]]
    # Taken in the order they failed.
    assert list(reversed(ids_in(client, keys.queue))) == [ids[1], ids[0], ids[2]]


def test_a_requeue_crashing_between_entries_loses_and_doubles_nothing(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    ids = dead_letter_tasks(client, keys, [0, 1, 2, 3, 4])

    class Crash(Exception):
        pass

    moved: list[str] = []

    def crash_after_two(letter: object) -> None:
        moved.append(letter.task_id)  # type: ignore[attr-defined]
        if len(moved) == 2:
            raise Crash

    with pytest.raises(Crash):
        requeue_dead_letters(client, keys, on_requeued=crash_after_two)
    dead_ids = [d.task_id for d in list_dead_letters(client, keys)]
    queued = ids_in(client, keys.queue)
    assert sorted(queued) == sorted(ids[:2])  # the two moved, oldest first
    assert Counter(queued) + Counter(dead_ids) == Counter(ids)  # each exactly once
    # Running it again finishes the job, still without a double.
    assert requeue_dead_letters(client, keys).requeued == ids[2:]
    assert Counter(ids_in(client, keys.queue)) == Counter(ids)
    assert client.llen(keys.dead_letters) == 0


def test_an_entry_requeued_by_someone_else_meanwhile_is_not_pushed_again(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    (failed,) = dead_letter_tasks(client, keys, ["x"])
    (letter,) = list_dead_letters(client, keys)  # two operators read the same entry
    assert requeue_one(client, keys, letter) is True
    assert requeue_one(client, keys, letter) is False
    assert ids_in(client, keys.queue) == [failed]


def test_entries_that_are_not_tasks_stay_in_place(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    client.lpush(keys.dead_letters, b"hand-pushed garbage")
    report = requeue_dead_letters(client, keys)
    assert report.requeued == [] and len(report.not_tasks) == 1
    assert client.lrange(keys.dead_letters, 0, -1) == [b"hand-pushed garbage"]
    assert client.llen(keys.queue) == 0


def test_purge_deletes_every_dead_letter_and_says_how_many(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    dead_letter_tasks(client, keys, [1, 2])
    assert purge_dead_letters(client, keys) == 2
    assert client.exists(keys.dead_letters) == 0
    assert purge_dead_letters(client, keys) == 0


# -- the CLI ----------------------------------------------------------------------------------


@pytest.mark.real_redis
def test_cli_dead_list_show_requeue_purge(real_redis: RedisServerProcess) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    keys = QueueKeys("cli")
    first, second = dead_letter_tasks(client, keys, [{"n": 1}, {"n": 2}])
    common = ["--queue", "cli", "--redis-url", real_redis.url]
    runner = CliRunner()

    out = runner.invoke(main, ["dead", "list", *common, "--json"])
    assert out.exit_code == 0, out.output
    listed = json.loads(out.output)
    assert [d["task_id"] for d in listed] == [second, first]
    assert listed[0]["payload"] == {"n": 2} and listed[0]["attempts"] == 3
    assert "ValueError: cannot handle" in listed[0]["error"]

    text = runner.invoke(main, ["dead", "list", *common])
    assert text.exit_code == 0
    assert f"{first}  attempts=3" in text.output and 'payload={"n": 1}' in text.output

    shown = runner.invoke(main, ["dead", "show", first, *common])
    assert shown.exit_code == 0
    assert "after 3 attempt(s)" in shown.output and '"n": 1' in shown.output
    as_json = runner.invoke(main, ["dead", "show", first, *common, "--json"])
    assert json.loads(as_json.output)["task_id"] == first

    requeued = runner.invoke(main, ["dead", "requeue", first, *common])
    assert requeued.exit_code == 0, requeued.output
    assert f"requeued 1 task(s) to queue cli, attempts reset to 0: {first}" in requeued.output
    assert ids_in(client, keys.queue) == [first]

    refused = runner.invoke(main, ["dead", "purge", *common])
    assert refused.exit_code == 2 and client.llen(keys.dead_letters) == 1
    purged = runner.invoke(main, ["dead", "purge", "--yes", *common])
    assert purged.exit_code == 0 and "purged 1 dead letter(s)" in purged.output
    assert client.llen(keys.dead_letters) == 0
    empty = runner.invoke(main, ["dead", "list", *common])
    assert empty.output.strip() == "no dead letters in queue cli"


@pytest.mark.real_redis
def test_requeueing_an_id_a_second_time_says_only_that_its_letter_is_gone(
    real_redis: RedisServerProcess,
) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    keys = QueueKeys("again")
    (task_id,) = dead_letter_tasks(client, keys, [{"n": 1}])
    command = ["dead", "requeue", task_id, "--queue", "again", "--redis-url", real_redis.url]
    first = CliRunner().invoke(main, command)
    assert first.exit_code == 0, first.output
    second = CliRunner().invoke(main, command)
    assert second.exit_code == 1
    assert second.stdout == ""  # no "requeued 0 task(s)" beside the error
    assert second.stderr == (
        f"Error: no dead letter with id {task_id} in queue again (already "
        "requeued or purged, or never dead-lettered)\n"
    )
    assert ids_in(client, keys.queue) == [task_id]  # moved once, by the first


@pytest.mark.real_redis
def test_requeueing_ids_some_missing_requeues_the_others_and_names_the_missing(
    real_redis: RedisServerProcess,
) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    keys = QueueKeys("some")
    present, other = dead_letter_tasks(client, keys, [{"n": 1}, {"n": 2}])
    result = CliRunner().invoke(
        main,
        [
            "dead",
            "requeue",
            "nope1",
            present,
            "nope2",
            "nope1",
            "--queue",
            "some",
            "--redis-url",
            real_redis.url,
        ],
    )
    assert result.exit_code == 1
    assert result.stdout == (f"requeued 1 task(s) to queue some, attempts reset to 0: {present}\n")
    assert result.stderr == (
        "Error: no dead letters with ids nope1 nope2 in queue some (already "
        "requeued or purged, or never dead-lettered); the other id(s) were "
        "requeued\n"
    )
    assert ids_in(client, keys.queue) == [present]
    assert [d.task_id for d in list_dead_letters(client, keys)] == [other]
    # The rule is in the command's help.
    helped = CliRunner().invoke(main, ["dead", "requeue", "--help"])
    assert "is named in one line on stderr and the exit status is 1" in " ".join(
        helped.output.split()
    )


def test_a_poison_pill_counts_its_recoveries_as_attempts() -> None:
    # The format recovery writes for a task that killed the processes running it.
    raw = b'{"id":"p1","payload":{"n":1},"attempts":1,"enqueued_at":0}'
    entry = json.dumps(
        {
            "raw": base64.b64encode(raw).decode(),
            "task_id": "p1",
            "at": 5,
            "poison": True,
            "recoveries": 4,
            "holders": ["a#1:w0"],
            "error": "poison pill: recovered 4 times from holders that died",
        }
    )
    letter = parse(entry.encode())
    assert letter.attempts == 5  # 1 failed release + 4 runs that died
    assert letter.to_dict()["poison"] is True and letter.to_dict()["recoveries"] == 4
    assert letter.requeueable


@pytest.mark.parametrize(
    "command",
    [["dead", "list"], ["dead", "show"], ["dead", "requeue"], ["dead", "purge"], ["result"]],
)
def test_every_dead_letter_and_result_command_has_help(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output
