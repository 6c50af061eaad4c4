"""NCCL RAS's client protocol (NCCL ``src/ras/client.cc``): one ``STATUS`` read, nothing else.

Send ``CLIENT PROTOCOL 2``, read ``SERVER PROTOCOL N``; ``TIMEOUT <s>`` and ``SET FORMAT json``
each answer ``OK`` (older servers answer ``ERROR: ...`` to the format and keep text); ``STATUS``
answers until the server closes the connection. Every socket operation is bounded by the
timeout. When and whether to ask (never by default: it has crashed jobs) is
:mod:`rankscope.capabilities.ras_read`'s; what the answer says is :mod:`rankscope.analysis.hang.ras`'s.
"""

from __future__ import annotations

import socket

PROTOCOL = 2
MAX_LINE = 4096


class NotRas(OSError):
    """Something else listens on the port: its first answer is not RAS's greeting."""

    def __init__(self, answer: str) -> None:
        super().__init__(f"not NCCL RAS (it answered {answer[:60]!r})")
        self.answer = answer


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < MAX_LINE:
        chunk = conn.recv(MAX_LINE - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def _command(conn: socket.socket, line: str) -> str:
    conn.sendall(line.encode() + b"\n")
    return _read_line(conn)


def status(host: str, port: int, *, leg_timeout: int, timeout: float, limit: int) -> tuple[str, bool]:
    """(the ``STATUS`` answer, at most ``limit`` bytes, and whether it is JSON) of the RAS server at
    ``host:port``, which waits ``leg_timeout`` seconds for other nodes' answers.

    Raises :class:`NotRas` when something else answers, OSError when nothing does.
    """
    with socket.create_connection((host, port), timeout=timeout) as conn:
        hello = _command(conn, f"CLIENT PROTOCOL {PROTOCOL}")
        if not hello.upper().startswith("SERVER PROTOCOL"):
            raise NotRas(hello)
        _command(conn, f"TIMEOUT {leg_timeout}")
        json_ok = _command(conn, "SET FORMAT json").upper() == "OK"
        conn.sendall(b"STATUS\n")
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    return b"".join(chunks).decode(errors="replace"), json_ok


__all__ = ["PROTOCOL", "NotRas", "status"]
