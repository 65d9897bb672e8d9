"""The audit's fault shim, loaded into a worker process through PYTHONPATH (Python imports
`sitecustomize` at start-up) before the worker's own entry point runs. Standalone: it runs in each
peer's venv, with whatever redis-py that peer pins, and patches nothing of the peer's code.

It wraps redis-py's connection layer -- `send_packed_command` and `read_response` of the sync
`redis.connection.AbstractConnection` and of the asyncio one -- the way
`taskcustody.verify.faults.DroppingConnectionMixin` does for our own verifier: the commands sent
are read from the request bytes (`requests`, `label`), and `read_response` pops the label of the
reply it reads. Two modes (environment):

* AUDIT_SHIM_MODE=record: append one line "<pid> <COMMAND> <0|1>" per reply read to
  $AUDIT_SHIM_DIR/commands.<pid> (1: the reply carried a task); nothing is dropped.
* AUDIT_SHIM_MODE=drop: let $AUDIT_DROP_SKIP replies to $AUDIT_DROP_COMMAND through in this
  process (with AUDIT_DROP_ONLY_TASK=1, counting only replies that carry a task), then read the
  next one (Redis ran the command), throw it away, read and discard the replies pipelined behind
  it, disconnect and raise redis.ConnectionError -- what a socket broken mid-reply gives. Fires
  once across all the worker's processes (an O_EXCL marker file), and appends one JSON
  line {time, pid, command, reply} to $AUDIT_SHIM_DIR/faults.log so that the harness knows which
  reply was lost, when, and which tasks it carried.

The drop logic follows the mixin's (the mixin subclasses a pool's connection class; a peer
builds its own pools, so the shim patches the class's methods instead).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections import deque
from typing import Any

_MODE = os.environ.get("AUDIT_SHIM_MODE", "")
_DIR = os.environ.get("AUDIT_SHIM_DIR", "")
_DROP = os.environ.get("AUDIT_DROP_COMMAND", "")
_SKIP = [int(os.environ.get("AUDIT_DROP_SKIP", "0"))]
# Count (skip, then drop) only replies that carry a task: a take's reply, whatever the polling
# in between, so that a replay hits the same kind of reply.
_ONLY_TASK = os.environ.get("AUDIT_DROP_ONLY_TASK") == "1"


def requests(packed: Any) -> list[list[bytes]]:
    """The commands in RESP request bytes (`*<n>`, then n bulk strings each), each as its list of
    arguments, in the order they are sent; [] for what is not such a request. (Like
    taskcustody.verify.faults.command_heads, which gives the heads only: the shim needs a script
    command's arguments too, to tell the scripts apart.)"""
    if isinstance(packed, (bytes, bytearray, memoryview)):
        data = bytes(packed)
    else:
        data = b"".join(bytes(p) for p in packed)
    out: list[list[bytes]] = []
    at = 0
    try:
        while at < len(data):
            if data[at : at + 1] != b"*":
                return out
            end = data.index(b"\r\n", at)
            count, at = int(data[at + 1 : end]), end + 2
            args: list[bytes] = []
            for _ in range(count):
                end = data.index(b"\r\n", at)
                length = int(data[at + 1 : end])
                args.append(data[end + 2 : end + 2 + length])
                at = end + 2 + length + 2
            out.append(args)
    except ValueError:
        pass
    return out


def label(args: list[bytes]) -> str:
    """A command's name, upper case; a script command also names its script (the first 8 hex
    digits of its SHA1) and, when the first argument after the keys is a short word (dramatiq's
    dispatch script takes its operation so: "fetch", "ack"), that word:
    EVALSHA/1a2b3c4d/fetch. One script is then one fault, not one for all of them."""
    if not args:
        return ""
    name = args[0].decode(errors="replace").split(" ", 1)[0].upper()
    if name in ("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO") and len(args) >= 3:
        script = args[1]
        sha = (
            hashlib.sha1(script).hexdigest()
            if name.startswith("EVAL") and not name.startswith("EVALSHA")
            else script.decode(errors="replace")
        )
        parts = [name, sha[:8]]
        with contextlib.suppress(ValueError, IndexError):
            first = args[3 + int(args[2])]
            if first.isalpha() and len(first) <= 16:
                parts.append(first.decode())
        return "/".join(parts)
    return name


def command_names(packed: Any) -> list[str]:
    return [label(a) for a in requests(packed)]


def _pending(conn: Any) -> deque[str]:
    queue: deque[str] | None = conn.__dict__.get("_audit_pending")
    if queue is None:
        queue = conn.__dict__["_audit_pending"] = deque()
    return queue


def _record(command: str, reply: Any) -> None:
    """One line per reply read: "<pid> <label> <1 if it carried a task token, else 0>"."""
    if _MODE != "record" or not command:
        return
    pid = os.getpid()
    carried = int("tk-" in repr(reply))
    fd = os.open(os.path.join(_DIR, f"commands.{pid}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, f"{pid} {command} {carried}\n".encode())
    finally:
        os.close(fd)


def _should_drop(command: str, reply: Any) -> bool:
    if _MODE != "drop" or command != _DROP:
        return False
    if _ONLY_TASK and "tk-" not in repr(reply):
        return False  # counting only the replies that carry a task
    if _SKIP[0] > 0:
        _SKIP[0] -= 1
        return False
    try:  # once across every process of the worker (a forked child inherits _SKIP)
        os.close(os.open(os.path.join(_DIR, "fired"), os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def _log_drop(command: str, reply: Any) -> None:
    line = json.dumps(
        {"time": time.time(), "pid": os.getpid(), "command": command, "reply": repr(reply)[:4000]}
    )
    fd = os.open(os.path.join(_DIR, "faults.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _install() -> None:
    import redis
    import redis.asyncio.connection as aconn
    import redis.connection as sconn

    error = redis.ConnectionError

    sync_cls: Any = sconn.AbstractConnection  # patched in place: typed loosely
    async_cls: Any = aconn.AbstractConnection
    s_send, s_read, s_disc = (
        sync_cls.send_packed_command,
        sync_cls.read_response,
        sync_cls.disconnect,
    )
    a_send, a_read, a_disc = (
        async_cls.send_packed_command,
        async_cls.read_response,
        async_cls.disconnect,
    )

    async def reading(conn: Any, read: Any, disconnect: Any) -> Any:
        """The one read path, for both connection classes: `read` and `disconnect` are
        coroutine functions (for the sync class, wrappers that never suspend)."""
        pending = _pending(conn)
        command = pending.popleft() if pending else ""
        try:
            reply = await read()
        except redis.ResponseError as exc:
            if not _should_drop(command, exc):
                raise
            reply = exc
            drop = True
        else:
            drop = _should_drop(command, reply)
        if drop:
            _log_drop(command, reply)
            while pending:
                pending.popleft()
                with contextlib.suppress(redis.ResponseError):
                    await read()
            await disconnect()
            raise error(f"reply to {command} dropped (injected fault)")
        _record(command, reply)
        return reply

    def send_packed_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        names = command_names(command)
        result = s_send(self, command, *args, **kwargs)
        _pending(self).extend(names)
        return result

    def disconnect(self: Any, *args: Any, **kwargs: Any) -> Any:
        _pending(self).clear()
        return s_disc(self, *args, **kwargs)

    def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        async def read() -> Any:
            return s_read(self, *args, **kwargs)

        async def disconnect_now() -> None:
            self.disconnect()

        return run_without_loop(reading(self, read, disconnect_now))

    async def a_send_packed_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        names = command_names(command)
        result = await a_send(self, command, *args, **kwargs)
        _pending(self).extend(names)
        return result

    async def a_disconnect(self: Any, *args: Any, **kwargs: Any) -> Any:
        _pending(self).clear()
        return await a_disc(self, *args, **kwargs)

    async def a_read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await reading(self, lambda: a_read(self, *args, **kwargs), self.disconnect)

    sync_cls.send_packed_command = send_packed_command
    sync_cls.read_response = read_response
    sync_cls.disconnect = disconnect
    async_cls.send_packed_command = a_send_packed_command
    async_cls.read_response = a_read_response
    async_cls.disconnect = a_disconnect


def run_without_loop(coroutine: Any) -> Any:
    """Run a coroutine that never suspends (every await in it reaches a plain function) to its
    end, without an event loop: the sync connection's read path shares the async one's code."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("the sync read path suspended")


if _MODE in ("record", "drop") and _DIR:
    _install()
