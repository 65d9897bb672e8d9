"""Name the redis-py errors a user can cause (through the URL, the server or the keyspace) as ours.

redis-py reports a wrong database index, a port that answers HTTP, a read-only replica or a key
of the wrong type as bare `ResponseError`s and `InvalidResponse`s whose text means little out of
context. `translate` turns each case we can name into an exception of `taskcustody.core.errors` that
says what is wrong and what to do; the library's entry points run under `named_errors`, and the
CLI maps whatever reaches it through the same function (cli/errors.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis import exceptions as rx

from ..core.errors import (
    AuthenticationFailed,
    ClusterRedirect,
    NoPermission,
    NoSuchDatabase,
    NotRedis,
    ReadOnlyReplica,
    RedisOutOfMemory,
    TaskCustodyError,
    WrongKeyType,
)
from ..core.keys import QueueKeys
from .oom import is_oom

# Redis's error codes for the cluster errors (MovedError first: it is a kind of AskError).
_CLUSTER_ERRORS: tuple[tuple[type[Exception], str], ...] = (
    (rx.MovedError, "MOVED"),
    (rx.AskError, "ASK"),
    (rx.ClusterDownError, "CLUSTERDOWN"),
    (rx.ClusterCrossSlotError, "CROSSSLOT"),
    (rx.TryAgainError, "TRYAGAIN"),
)


def _kwargs(client: redis.Redis | None) -> dict[str, Any]:
    """A client's connection settings; empty for a client without one pool (a cluster client)."""
    pool = getattr(client, "connection_pool", None)
    return dict(getattr(pool, "connection_kwargs", {}) or {})


_PIPELINE_PREFIX = re.compile(r"^Command # \d+ \(.*?\) of pipeline caused error: ", re.S)


def reply_text(exc: BaseException) -> str:
    """Redis's reply, without the prefix redis-py adds to an error inside a pipeline."""
    return _PIPELINE_PREFIX.sub("", str(exc))


def where(client: redis.Redis | None) -> str:
    """host:port (or the socket path) of a client, for messages."""
    kwargs = _kwargs(client)
    if not kwargs:
        return "the server"
    if kwargs.get("path"):
        return f"Redis at unix:{kwargs['path']}"
    return f"Redis at {kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def is_wrong_type(exc: BaseException) -> bool:
    # In a pipeline redis-py prefixes the text ("Command # 1 (GET ...) of pipeline caused error:").
    return isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc)


def is_unknown_command(exc: BaseException) -> bool:
    return isinstance(exc, redis.ResponseError) and str(exc).lower().startswith("unknown command")


def expected_type(keys: QueueKeys, key: str) -> str | None:
    """The Redis type taskcustody needs at `key`, if the key is one of the queue's."""
    fixed = keys.all_fixed_keys()
    if key in fixed:
        return fixed[key]
    if key.startswith(keys.result_prefix):
        return "string"
    if key.startswith(keys.inflight_prefix):
        return "list"
    return None


def name_wrong_type(
    client: redis.Redis | None, keys: QueueKeys | None, touched: Iterable[str], exc: BaseException
) -> WrongKeyType:
    """WRONGTYPE names no key: ask the keys the failed step touched which one it was."""
    touched = list(touched)
    if client is not None and keys is not None:
        for key in touched:
            want = expected_type(keys, key)
            if want is None:
                continue
            try:
                got = client.type(key)
            except redis.RedisError:
                break  # the key stays unnamed; the error below still says what happened
            kind = got.decode() if isinstance(got, bytes) else str(got)
            if kind not in ("none", want):
                return WrongKeyType(
                    f"key {key!r} holds a {kind}, but taskcustody needs a {want} there"
                )
    scope = f"one of {', '.join(touched)}" if touched else "a key of the queue"
    return WrongKeyType(f"{scope} holds the wrong Redis type ({exc})")


def translate(
    exc: BaseException,
    client: redis.Redis | None = None,
    keys: QueueKeys | None = None,
    touched: Iterable[str] = (),
) -> BaseException:
    """Our exception for `exc` if we can name its case, else `exc` itself."""
    if isinstance(exc, TaskCustodyError):
        return exc
    server = where(client)
    text = reply_text(exc)
    db: Any = _kwargs(client).get("db", "?")
    if isinstance(exc, rx.InvalidResponse):
        return NotRedis(
            f"{server} does not speak the Redis protocol ({text}): is the URL's "
            "port that of a Redis server?"
        )
    if isinstance(exc, (rx.AuthenticationError, rx.AuthenticationWrongNumberOfArgsError)):
        settings = _kwargs(client)
        if settings and settings.get("password") is None:
            # redis-py's text here is about HELLO, which the user never sent.
            return AuthenticationFailed(
                f"{server} requires a password and the URL gives none: "
                "redis://[USER]:PASSWORD@host:port/db"
            )
        return AuthenticationFailed(
            f"{server} refused the credentials ({text}): check the user and password in the URL"
        )
    if isinstance(exc, rx.NoPermissionError):
        return NoPermission(
            f"the Redis user may not run a command taskcustody needs ({text}): "
            "grant it, or use another user"
        )
    if isinstance(exc, rx.ReadOnlyError) or (
        # Redis 6.2 refuses a write inside a script with a script error quoting READONLY
        isinstance(exc, redis.ResponseError) and "-READONLY " in str(exc)
    ):
        return ReadOnlyReplica(
            f"{server} is a replica and refuses writes ({text}): point the URL at the primary"
        )
    for kind, code in _CLUSTER_ERRORS:
        if not isinstance(exc, kind):
            continue
        return ClusterRedirect(
            f"{server} is a Redis Cluster node ({code} {text}): connect to "
            "the cluster in cluster mode, or check that it is up"
        )
    if isinstance(exc, redis.ResponseError):
        if "DB index is out of range" in text or "invalid DB index" in text:
            return NoSuchDatabase(
                f"{server} has no database {db} ({text}): use an index below "
                "its 'databases' setting (16 by default)"
            )
        if is_wrong_type(exc):
            return name_wrong_type(client, keys, touched, exc)
        if is_oom(exc):
            return RedisOutOfMemory(f"{server} is out of memory ({text}): nothing was written")
    return exc


@contextmanager
def named_errors(
    client: redis.Redis | None = None, keys: QueueKeys | None = None, *touched: str
) -> Iterator[None]:
    """Run a block, raising our named exception for any redis-py error we can name. `touched`:
    the keys the block uses, so that a WRONGTYPE names the culprit."""
    try:
        yield
    except redis.RedisError as exc:
        ours = translate(exc, client, keys, touched)
        if ours is exc:
            raise
        raise ours from exc


def refuse_replica(client: redis.Redis) -> None:
    """A replica refuses writes (READONLY), but only once a command writes: a sweep or a worker
    with nothing to do would seem to work there. Named up front instead. Skipped where INFO is
    unknown or forbidden (fakeredis, some managed services)."""
    try:
        role = client.info("replication").get("role")
    except redis.ResponseError:
        return
    if role in ("slave", "replica", b"slave"):
        raise ReadOnlyReplica(
            f"{where(client)} is a replica: taskcustody writes, point the URL at the primary"
        )


def reachable(client: redis.Redis) -> None:
    """PING: connect, authenticate and select the database now, so that a wrong URL is named
    before any other check can mistake its error for something else (an INFO refused because
    the database index is out of range is not an old Redis)."""
    try:
        with named_errors(client):
            client.ping()
    except (TaskCustodyError, redis.ResponseError) as exc:
        # A server older than 6.0 refuses the HELLO that redis-py 8 sends on connecting
        # ("unknown command `HELLO`"): that is a Redis too old, which the version check names
        # (connection.check_version). (Not a HELLO refused for want of a password.)
        text = str(exc.__cause__ or exc).lower()
        if not ("unknown command" in text and "hello" in text):
            raise
