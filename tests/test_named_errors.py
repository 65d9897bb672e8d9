"""The library raises taskcustody.errors types, not raw redis-py errors, for the cases we name."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest
import redis
from redis import exceptions as rx

from taskcustody import (
    BadPayload,
    ClusterRedirect,
    NoPermission,
    NoSuchDatabase,
    NotRedis,
    Producer,
    QueueKeys,
    ReadOnlyReplica,
    RedisOutOfMemory,
    WrongKeyType,
    check_server,
    connect,
    queue_status,
)
from taskcustody.deploy.redis_errors import translate
from tests.conftest import Backend
from tests.support.redis_server import RedisServerProcess


def test_enqueue_onto_a_queue_key_of_the_wrong_type_names_the_key(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    client.set(keys.queue, "oops")
    with pytest.raises(WrongKeyType, match=r"queue'? holds a string, but taskcustody needs a list"):
        Producer(client, keys).enqueue({"a": 1})
    with pytest.raises(redis.ResponseError):  # still what callers caught before
        Producer(client, keys).enqueue_many([1, 2])
    assert client.get(keys.queue) == b"oops"


def test_status_of_a_queue_whose_key_holds_a_string_names_the_key(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    client.set(keys.dead_letters, "oops")
    with pytest.raises(WrongKeyType, match=r"dead'? holds a string, but taskcustody needs a list"):
        queue_status(client, keys, 0.0)


def test_an_unserialisable_payload_is_a_bad_payload_and_still_a_value_error(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    with pytest.raises(BadPayload, match="not JSON-serialisable"):
        Producer(client, keys).enqueue(float("nan"))
    with pytest.raises(ValueError):
        Producer(client, keys).enqueue({1, 2})
    assert client.llen(keys.queue) == 0


@pytest.mark.real_redis
def test_a_database_index_out_of_range_is_named_not_mistaken_for_an_old_redis(
    real_redis: RedisServerProcess, keys: QueueKeys
) -> None:
    client = connect(f"redis://127.0.0.1:{real_redis.port}/99")
    with pytest.raises(NoSuchDatabase, match="has no database 99"):
        check_server(client, keys)
    with pytest.raises(NoSuchDatabase):
        Producer(client, keys).enqueue(1)
    with pytest.raises(NoSuchDatabase):
        queue_status(client, keys, 0.0)


@contextlib.contextmanager
def http_like_port() -> Iterator[int]:
    """A port that answers every request with an HTTP/1.1 400, then closes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)


def test_a_port_that_answers_http_is_named(keys: QueueKeys) -> None:
    with http_like_port() as port:
        client = connect(f"redis://127.0.0.1:{port}/0")
        with pytest.raises(NotRedis, match="does not speak the Redis protocol"):
            check_server(client, keys)
        with pytest.raises(NotRedis):
            Producer(client, keys).enqueue(1)


@pytest.mark.parametrize(
    ("raw", "ours", "text"),
    [
        (rx.MovedError("3999 127.0.0.1:7001"), ClusterRedirect, "Redis Cluster node (MOVED"),
        (rx.AskError("3999 127.0.0.1:7001"), ClusterRedirect, "(ASK"),
        (rx.ClusterDownError("Hash slot not served"), ClusterRedirect, "(CLUSTERDOWN"),
        (
            rx.ClusterCrossSlotError("Keys in request don't hash to the same slot"),
            ClusterRedirect,
            "(CROSSSLOT",
        ),
        (
            rx.ReadOnlyError("You can't write against a read only replica."),
            ReadOnlyReplica,
            "refuses writes",
        ),
        (
            rx.ResponseError(  # Redis 6.2, refusing a write inside a script
                "Error running script (call to f_6797): @user_script:3: @user_script: 3: -READONLY "
                "You can't write against a read only replica."
            ),
            ReadOnlyReplica,
            "refuses writes",
        ),
        (
            rx.NoPermissionError("this user has no permissions to run the 'lmove' command"),
            NoPermission,
            "may not run",
        ),
        (rx.ResponseError("DB index is out of range"), NoSuchDatabase, "no database"),
        (
            rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
            RedisOutOfMemory,
            "out of memory",
        ),
        (
            rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
            WrongKeyType,
            "wrong Redis type",
        ),
        (rx.InvalidResponse("Protocol Error: b'HTTP/1.1 400'"), NotRedis, "Redis protocol"),
    ],
)
def test_each_nameable_redis_error_translates_to_ours(
    raw: Exception, ours: type[Exception], text: str
) -> None:
    named = translate(raw)
    assert isinstance(named, ours)
    assert text in str(named)


def test_an_error_we_cannot_name_is_left_alone() -> None:
    raw = rx.ResponseError("ERR something new")
    assert translate(raw) is raw
    refused = redis.ConnectionError("Connection refused")
    assert translate(refused) is refused
