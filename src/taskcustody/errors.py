"""The errors taskcustody raises on purpose, each naming what is wrong."""

from __future__ import annotations


class TaskCustodyError(Exception):
    """Base of every error this library raises on purpose."""


class RedisTooOld(TaskCustodyError):
    """The server lacks BLMOVE/LMOVE (Redis < 6.2)."""


class ServerIdHeld(TaskCustodyError):
    """Another live process holds this server id (its heartbeat deadline lies in the future)."""


class Superseded(TaskCustodyError):
    """A newer incarnation claimed our server id while we were stalled: we must stop taking."""


class WrongKeyType(TaskCustodyError):
    """A key of the queue holds a value of the wrong Redis type."""


class MalformedTask(TaskCustodyError):
    """Bytes in the queue that are not a task envelope (not JSON, or no id)."""

    def __init__(self, raw: bytes, reason: str) -> None:
        super().__init__(f"malformed task envelope ({reason}): {raw[:80]!r}")
        self.raw = raw
        self.reason = reason


class InvalidName(TaskCustodyError, ValueError):
    """A queue name, prefix, server id or worker id that would break the key schema."""
