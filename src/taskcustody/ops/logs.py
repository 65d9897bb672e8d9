"""Logging: the worker's log set-up (`--log-level`, `--log-format text|json`), a small JSON
formatter, and how a Redis client is named in a log line (never with its password).

Everything logs through the stdlib `logging` module under the `taskcustody` logger; a library
user configures it as they configure any other. Lines about one task carry its id in the message
and, for the JSON format, as the `task_id` field (`extra={"task_id": ...}`).
"""

from __future__ import annotations

import json
import logging
import weakref
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

# The attributes every LogRecord has: anything else on a record came from `extra=` and goes into
# the JSON object as a field of its own.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the record's
    `extra` fields (task_id, ...), and the traceback as `exc` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "info", fmt: str = "text") -> logging.Handler:
    """Send the `taskcustody` logger's records (and the root logger's) to stderr in `fmt` at
    `level`; returns the handler installed. Replaces the root logger's handlers, as
    `logging.basicConfig(force=True)` does: the CLI owns its process's logging."""
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler


def configure_while(ctx: Any, level: str = "info", fmt: str = "text") -> logging.Handler:
    """`configure` for as long as the click context `ctx` lasts: the root logger's handlers and
    level are put back when it closes (a command invoked in-process, e.g. by a test's CliRunner,
    leaves no logging behind it)."""
    root = logging.getLogger()
    handlers, old_level = root.handlers[:], root.level
    handler = configure(level, fmt)

    def restore() -> None:
        root.handlers[:] = handlers
        root.setLevel(old_level)

    ctx.call_on_close(restore)
    return handler


def redact_url(url: str) -> str:
    """`url` with its password (if any, in the authority or as a `password` query parameter, as
    redis-py accepts both) replaced by `***`."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key == "password" for key, _ in query):
        parts = parts._replace(
            query=urlencode(
                [(key, "***" if key == "password" else value) for key, value in query], safe="*"
            )
        )
    if parts.password is None:
        return urlunsplit(parts)
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


# The URL each client of `connection.connect` was made from, as the user wrote it. A cluster
# client cannot say it: it keeps the nodes of the slot map, not its seed, so a banner built from
# the client named whichever node the client picked as its default.
_given_urls: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def remember_url(client: Any, url: str) -> None:
    """Note that `client` was made from `url` (what `client_url` then names)."""
    _given_urls[client] = url


def client_url(client: redis.Redis) -> str:
    """Where `client` connects, as a URL without its password (`***` in its place): the URL it
    was made from when `connect` made it, else one rebuilt from its settings."""
    given = _given_urls.get(client)
    if given is not None:
        return redact_url(given)
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        # A cluster client not made by `connect`: it keeps the slot map's nodes, not its seed;
        # its default node (any node of the cluster) stands for the cluster.
        node = client.get_default_node()  # type: ignore[attr-defined]
        return f"redis-cluster://{node.host}:{node.port}"
    kwargs = pool.connection_kwargs
    auth = ""
    if kwargs.get("password"):
        auth = f"{kwargs.get('username') or ''}:***@"
    elif kwargs.get("username"):
        auth = f"{kwargs['username']}@"
    if kwargs.get("path"):
        return f"unix://{auth}{kwargs['path']}?db={kwargs.get('db', 0)}"
    scheme = "rediss" if "SSL" in pool.connection_class.__name__ else "redis"
    host = str(kwargs.get("host", "localhost"))
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{auth}{host}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
