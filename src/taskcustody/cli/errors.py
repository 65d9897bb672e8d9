"""Every error a user can cause, as one line and an exit code: 1 at run time, 2 for usage.

The one place where the CLI decides how an exception reads. `MappedErrors` (the `taskcustody`
group) runs every command under `as_click`, so a case no command anticipated still comes out as a
line, never a traceback. Usage (2): what is wrong without asking Redis (a bad name, a payload JSON
cannot hold, a malformed URL). Run time (1): what the server or the keyspace says (unreachable,
refused credentials, no such database, not Redis, a key of the wrong type, too old, a cluster
node, out of memory). An exception that is none of these is a bug of ours and keeps its traceback.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlparse

import click
import redis

from ..core.errors import BadPayload, InvalidName, TaskCustodyError
from ..deploy.redis_errors import translate


class Failure(click.ClickException):
    """A runtime failure: exit 1 with one line."""

    exit_code = 1


class UsageFailure(click.ClickException):
    """A usage error found after parsing (a name, a payload): exit 2 with one line (no usage
    banner: the line names the culprit)."""

    exit_code = 2


def one_line(text: str) -> str:
    """Messages may quote multi-line text (a handler's error, a server reply)."""
    return "; ".join(part.strip() for part in text.splitlines() if part.strip()) or text


def as_click(exc: BaseException) -> click.ClickException | None:
    """The ClickException that reports `exc`, or None for an exception that is a bug."""
    if isinstance(exc, click.ClickException):
        return exc
    if isinstance(exc, redis.RedisError):
        exc = translate(exc)
    if isinstance(exc, (InvalidName, BadPayload)):
        return UsageFailure(one_line(str(exc)))
    if isinstance(exc, TaskCustodyError):
        return Failure(one_line(str(exc)))
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return Failure(one_line(f"cannot reach Redis: {exc}"))
    if isinstance(exc, redis.RedisError):
        return Failure(one_line(f"Redis refused: {exc}"))
    return None


class MappedErrors(click.Group):
    """A group whose commands' errors go through `as_click`. `lazy_commands` (name ->
    "module:attribute") are imported when first used: a module of commands may then import the
    options of the module that defines the group without an import cycle."""

    def __init__(
        self, *args: Any, lazy_commands: dict[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = self.lazy_commands.pop(cmd_name, None)
        if spec is not None:
            module, _, attr = spec.partition(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            mapped = as_click(exc)
            if mapped is None:
                raise
            raise mapped from exc


def check_url(url: str) -> None:
    """What redis-py would accept silently: a database path that is not a number (it connects to
    database 0 instead)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss"):
        return  # unix:// takes the database from ?db=; other schemes fail in redis-py itself
    path = parsed.path.strip("/")
    if path and not path.isdigit():
        raise click.BadParameter(
            f"database {path!r} in {url!r} is not a number (want redis://host:port/N)",
            param_hint="--redis-url",
        )
