"""A dead letter keeps its handler's traceback (bounded): `dead show` prints it, with the handler's
file and line numbers; `dead list`, `result` and the logs keep the error's one line. Every kind of
worker (threaded, prefetching, asyncio) stores it the same way."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import redis
import redis.asyncio
from click.testing import CliRunner, Result

from taskcustody import (
    AsyncWorker,
    ListOwner,
    ManualClock,
    Producer,
    QueueKeys,
    TaskFailed,
    dead_letter,
    get_result,
)
from taskcustody.cli import dead as cli_dead
from taskcustody.cli.app import main
from taskcustody.core.outcome import MAX_TRACEBACK
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import dead_letters, make_server
from tests.support.aio import run_with_client

DEPTH = 400  # frames of the deep handler: a traceback of tens of KB, well past the bound


def _inner(n: int) -> None:
    raise ValueError(f"boom on n={n}")


def _middle(n: int) -> None:
    _inner(n)


def nested_handler(payload: Any) -> None:
    _middle(payload["n"])


def _down(n: int) -> None:
    if n == 0:
        raise ValueError("hit the bottom")
    _across(n - 1)


def _across(n: int) -> None:
    _down(n)  # mutual recursion: Python folds repeated identical lines, not alternating ones


def deep_handler(payload: Any) -> None:
    _down(DEPTH)


def frame_line(fn: Any, offset: int) -> str:
    """How the traceback names the line `offset` lines below `fn`'s `def`."""
    return f'File "{__file__}", line {fn.__code__.co_firstlineno + offset}, in {fn.__name__}'


NESTED_FRAMES = [frame_line(nested_handler, 1), frame_line(_middle, 1), frame_line(_inner, 1)]


def dead_lettered(
    client: redis.Redis, keys: QueueKeys, handler: Any, payload: Any, prefetch: int = 1
) -> str:
    """Enqueue `payload` and run a server's worker until its handler failed max_attempts times."""
    settings = dataclasses.replace(TEST_SETTINGS, prefetch=prefetch)
    task_id = Producer(client, keys, ManualClock()).enqueue(payload)
    (worker,) = make_server(client, keys, "tb", ManualClock(), handler, settings=settings).start()
    try:
        for _ in range(TEST_SETTINGS.max_attempts):
            assert worker.run_once(timeout=0.05)
    finally:
        worker.close()
    assert client.llen(keys.dead_letters) == 1
    return task_id


def cli(
    backend: Backend, client: redis.Redis, monkeypatch: pytest.MonkeyPatch, *args: str
) -> Result:
    """`taskcustody ARGS --queue tq --prefix test` on `backend`: a real server by its URL; for
    fakeredis, the command's client is the test's."""
    url = backend.url or "redis://127.0.0.1:1/0"
    if not backend.real:
        monkeypatch.setattr(cli_dead, "_client", lambda *a, **k: client)
    return CliRunner().invoke(
        main, [*args, "--queue", "tq", "--prefix", "test", "--redis-url", url]
    )


def test_dead_show_prints_the_handlers_traceback_with_its_file_and_line_numbers(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = backend.client()
    task_id = dead_lettered(client, keys, nested_handler, {"n": 47})
    shown = cli(backend, client, monkeypatch, "dead", "show", task_id)
    assert shown.exit_code == 0, shown.output
    out = shown.output
    assert "traceback:" in out and "Traceback (most recent call last):" in out
    # every frame from the handler down, in order, with the file and the line numbers
    positions = [out.index(frame) for frame in NESTED_FRAMES]
    assert positions == sorted(positions), out
    assert 'raise ValueError(f"boom on n={n}")' in out  # the source line, too
    assert out.rstrip().splitlines()[-1] != "ValueError: boom on n=47"  # the payload follows
    assert "  ValueError: boom on n=47" in out
    # the worker's own frames above the handler say nothing about the failure: left out
    assert "taskcustody/core/worker.py" not in out


def test_dead_list_and_result_keep_one_line_per_letter_while_json_carries_the_traceback(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = backend.client()
    task_id = dead_lettered(client, keys, nested_handler, {"n": 47})
    client.lpush(
        keys.dead_letters, json.dumps({"raw": "", "error": "older", "task_id": "x", "at": 0})
    )  # one written before tracebacks
    client.lmove(keys.dead_letters, keys.dead_letters, "LEFT", "RIGHT")  # as the older one
    listed = cli(backend, client, monkeypatch, "dead", "list")
    assert listed.exit_code == 0, listed.output
    lines = listed.output.strip().splitlines()
    assert len(lines) == 2, listed.output
    assert lines[0].startswith(task_id) and "error=ValueError: boom on n=47  " in lines[0]
    assert "error=older" in lines[1]
    as_json = json.loads(cli(backend, client, monkeypatch, "dead", "list", "--json").output)
    assert as_json[0]["error"] == "ValueError: boom on n=47"
    assert all(frame in as_json[0]["traceback"] for frame in NESTED_FRAMES)
    assert "traceback" not in as_json[1]
    with pytest.raises(TaskFailed) as failed:
        get_result(client, keys, task_id, timeout=0)
    assert str(failed.value).endswith("dead-lettered: ValueError: boom on n=47")


def test_an_enormous_traceback_is_stored_bounded_keeping_its_innermost_frames(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    task_id = dead_lettered(client, keys, deep_handler, "deep")
    (entry,) = client.lrange(keys.dead_letters, 0, -1)
    assert len(entry) < 2 * MAX_TRACEBACK  # the whole entry, not only its traceback
    trace = dead_letter(client, keys, task_id).traceback
    assert len(trace) <= MAX_TRACEBACK
    lines = trace.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "characters of the traceback left out" in lines[1]
    assert lines[-1] == "ValueError: hit the bottom"
    assert frame_line(_down, 2) in trace  # the innermost frame: the raise
    assert frame_line(deep_handler, 1) not in trace  # the outermost went
    assert trace.count(frame_line(_across, 1)) > 10  # as many inner frames as fit


def test_a_prefetching_worker_stores_the_traceback_as_the_single_worker_does(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    task_id = dead_lettered(client, keys, nested_handler, {"n": 47}, prefetch=3)
    trace = dead_letter(client, keys, task_id).traceback
    assert all(frame in trace for frame in NESTED_FRAMES), trace
    assert "taskcustody/core/prefetch.py" not in trace


@pytest.mark.parametrize("kind", ["async def", "plain def"])
def test_the_asyncio_worker_stores_the_traceback_as_the_threaded_one_does(
    backend: Backend, keys: QueueKeys, kind: str
) -> None:
    async def async_handler(payload: Any) -> None:
        nested_handler(payload)

    handler = async_handler if kind == "async def" else nested_handler

    async def test(aclient: redis.asyncio.Redis) -> None:
        worker = AsyncWorker(
            aclient, keys, ListOwner("a1", 1, "w0"), handler, ManualClock(), TEST_SETTINGS
        )
        await worker.register()
        await worker.reconcile()
        try:
            for _ in range(TEST_SETTINGS.max_attempts):
                assert await worker.run_once(timeout=0.05)
        finally:
            await worker.close()

    client = backend.client()
    Producer(client, keys, ManualClock()).enqueue({"n": 47})
    run_with_client(test, backend)
    (letter,) = dead_letters(client, keys)
    trace = letter["traceback"]
    assert all(frame in trace for frame in NESTED_FRAMES), trace
    assert trace.endswith("ValueError: boom on n=47")
    # a plain handler runs in a thread (asyncio.to_thread): that machinery is left out too
    assert "asyncio" not in trace and "concurrent" not in trace and "taskcustody/aio" not in trace
