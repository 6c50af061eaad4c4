"""Read one key of a job's c10d TCPStore without torch: the store's own wire protocol, read-only.

Importing torch to read a key costs seconds and hundreds of MB with a CUDA build, on the first
call of an incident. The protocol is small (torch/csrc/distributed/c10d/TCPStore.cpp and
TCPStoreBackend.hpp, torch >= 2.4): every query is a one-byte type followed by its arguments,
integers in the host's byte order, strings as a u64 length and the bytes. A client first sends
``VALIDATE`` with a magic number; ``CHECK`` answers READY (0) or NOT_READY (1); ``GET`` answers
a u64 length and the bytes. Keys carry the client's prefix ``/``. Only CHECK and GET are sent:
nothing is ever written. A store that speaks an older dialect closes the connection or answers
out of turn: :class:`StoreProtocolError`, and the caller may fall back to torch's client.
"""

from __future__ import annotations

import socket
import struct
import sys

VALIDATE, GET, CHECK = 0, 3, 5
VALIDATION_MAGIC = 0x3C85F7CE
READY, NOT_READY = 0, 1
KEY_PREFIX = "/"
MAX_VALUE = 1 << 20

_BO = "<" if sys.byteorder == "little" else ">"


class StoreProtocolError(OSError):
    """The store answered in a way this client does not understand (another protocol version)."""


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(f"{_BO}Q", len(data)) + data


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise StoreProtocolError("the store closed the connection")
        out += chunk
    return out


def read_key(host: str, port: int, key: str, timeout: float = 3.0) -> bytes | None:
    """The value of ``key`` in the store at ``host:port``, or None when it is not set.

    Raises OSError when the store cannot be reached, StoreProtocolError when it answers in
    another dialect; every socket operation is bounded by ``timeout``.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(f"{_BO}BI", VALIDATE, VALIDATION_MAGIC))
        sock.sendall(struct.pack(f"{_BO}BQ", CHECK, 1) + _string(KEY_PREFIX + key))
        answer = _recv(sock, 1)[0]
        if answer == NOT_READY:
            return None
        if answer != READY:
            raise StoreProtocolError(f"unexpected CHECK answer {answer}")
        sock.sendall(struct.pack(f"{_BO}B", GET) + _string(KEY_PREFIX + key))
        (size,) = struct.unpack(f"{_BO}Q", _recv(sock, 8))
        if size > MAX_VALUE:
            raise StoreProtocolError(f"a value of {size} bytes: not this protocol")
        return _recv(sock, size)


__all__ = ["StoreProtocolError", "read_key"]
