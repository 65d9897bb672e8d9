"""Commands packed once: the worker's hot path sends the same script with the same keys for every
task, so its bytes on the wire are built once per worker and only the arguments that change (the
task's bytes, its id, the outcome) are packed per call.

redis-py packs every argument of every call through its generic encoder (a Python loop over the
arguments, then hiredis's packer or its own); for a release of twenty arguments that is most of
the client's own work per task. `Template` does the same RESP encoding, once, for the arguments
that never change. Its bytes are RESP's multi-bulk request, the bytes redis-py sends for the same
arguments (tests/test_wire.py compares them with `Connection.pack_command`'s).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any


def bulk(value: Any) -> bytes:
    """One argument as a RESP bulk string, encoded as redis-py's encoder does: bytes as they
    are, str as UTF-8, int and float by their repr (a bool is refused, as redis-py does)."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode()
    elif isinstance(value, bool):
        raise TypeError("a bool is not a Redis argument")
    elif isinstance(value, int | float):
        data = repr(value).encode()
    else:
        raise TypeError(f"{type(value).__name__} is not a Redis argument")
    return b"$%d\r\n%b\r\n" % (len(data), data)


class Template:
    """A command whose arguments are the same in every call except at the positions `changing`.

    >>> t = Template(["EVALSHA", "abc", 1, "key", "old"], changing={4})
    >>> t.pack(["EVALSHA", "abc", 1, "key", b"raw"])
    b'*5\\r\\n$7\\r\\nEVALSHA\\r\\n$3\\r\\nabc\\r\\n$1\\r\\n1\\r\\n$3\\r\\nkey\\r\\n$3\\r\\nraw\\r\\n'

    `pack` reads only the changing positions of what it is given; the others were packed from
    `sample` and must be what the caller would pass (the worker builds both from one function).
    """

    def __init__(self, sample: Sequence[Any], changing: Collection[int]) -> None:
        self.length = len(sample)
        self._segments: list[bytes] = []  # constants before each changing position
        self._changing: list[int] = sorted(changing)
        run = b"*%d\r\n" % len(sample)
        for i, arg in enumerate(sample):
            if i in changing:
                self._segments.append(run)
                run = b""
            else:
                run += bulk(arg)
        self._tail = run

    def pack(self, args: Sequence[Any]) -> bytes:
        """The command's bytes, with `args[i]` at each changing position `i`."""
        if len(args) != self.length:
            raise ValueError(f"{len(args)} arguments for a template of {self.length}")
        parts: list[bytes] = []
        for segment, i in zip(self._segments, self._changing, strict=True):
            value = args[i]
            # the hot path's arguments are str and bytes: encode those inline
            data = value.encode() if type(value) is str else value
            if type(data) is not bytes:
                parts.append(segment + bulk(value))
            else:
                parts.append(b"%b$%d\r\n%b\r\n" % (segment, len(data), data))
        parts.append(self._tail)
        return b"".join(parts)
