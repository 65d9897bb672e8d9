"""A stand-in for a server older than Redis 6.0, over a real socket: it knows no HELLO (which
redis-py 8 sends, `HELLO 3`, on every new connection) and answers INFO with the version it is
given, and PING with PONG, as Redis 5 does (redis-py 8.2 pings a connection that fell back to
RESP2 after its HELLO was refused). Everything else is an unknown command.

For the refusal tests that must run without an old redis-server binary: the real one
(tests/test_server_below_the_floor.py, $TASKCUSTODY_OLD_REDIS_SERVER) runs in .ci/matrix.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import BinaryIO


def _read_command(stream: BinaryIO) -> list[bytes] | None:
    header = stream.readline()
    if not header:
        return None
    if not header.startswith(b"*"):
        raise ValueError(f"not a RESP array: {header!r}")
    parts = []
    for _ in range(int(header[1:])):
        size = int(stream.readline()[1:])
        parts.append(stream.read(size + 2)[:-2])
    return parts


def _serve_connection(conn: socket.socket, version: str) -> None:
    # A client that hangs up mid-command ends its connection, nothing more.
    with conn, conn.makefile("rb") as stream, contextlib.suppress(OSError, ValueError):
        while (command := _read_command(stream)) is not None:
            name = command[0].decode().upper()
            if name == "INFO":
                body = f"# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n"
                conn.sendall(f"${len(body)}\r\n{body}\r\n".encode())
            elif name == "PING":
                conn.sendall(b"+PONG\r\n")
            else:
                # Redis 5's wording, which redis-py raises as a ResponseError.
                args = "".join(f"`{a.decode()}`, " for a in command[1:])
                conn.sendall(
                    f"-ERR unknown command `{name}`, with args beginning with: {args}\r\n".encode()
                )


@contextlib.contextmanager
def pre_hello_server(version: str) -> Iterator[str]:
    """Serve on a free port until the block ends; yields the server's URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # so that the accept loop sees `done` (close does not wake accept)
    port = listener.getsockname()[1]
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            threading.Thread(target=_serve_connection, args=(conn, version), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        done.set()
        thread.join(timeout=5)
        listener.close()
