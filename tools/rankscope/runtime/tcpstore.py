"""Read one key of a job's c10d TCPStore without torch: the store's own wire protocol, read-only.

Importing torch to read a key costs seconds and hundreds of MB with a CUDA build, on the first
call of an incident. The protocol is small (torch/csrc/distributed/c10d/TCPStore.cpp and
TCPStoreBackend.hpp, torch >= 2.4): every query is a one-byte type followed by its arguments,
integers in the host's byte order, strings as a u64 length and the bytes. A client first sends
``VALIDATE`` with a magic number; ``CHECK`` answers READY (0) or NOT_READY (1); ``GET`` answers
a u64 length and the bytes. Keys carry the client's prefix ``/``. Only CHECK and GET are sent:
nothing is ever written. A store that speaks an older dialect closes the connection or answers
out of turn: :class:`StoreProtocolError`, and the caller may fall back to torch's client
(:func:`read_key_with_torch`). Keys only torch's client can list (a ``PrefixStore``'s, read by
:func:`rank_values`) are read with it too: every connection to a job's store starts here.
"""

from __future__ import annotations

import socket
import struct
import sys
from typing import Any

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


def _torch_client(host: str, port: int, timeout: float) -> Any:
    """torch's own TCPStore client, connected; ImportError without torch, OSError when the store
    does not answer (torch raises DistStoreError or RuntimeError: the first line of its text is kept)."""
    from datetime import timedelta

    from torch._C._distributed_c10d import TCPStore  # where torch.distributed takes it from

    try:
        return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))
    except Exception as exc:  # a refused or timed-out connect
        raise OSError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc


def read_key_with_torch(host: str, port: int, key: str, timeout: float = 3.0) -> bytes | None:
    """:func:`read_key` through torch's client, for a store that speaks another dialect.

    Raises ImportError without torch and OSError when the store cannot be reached.
    """
    store = _torch_client(host, port, timeout)
    if not store.check([key]):
        return None
    return bytes(store.get(key))


def rank_values(host: str, port: int, prefix: str, timeout: float, limit: int = 1_000_000) -> list[str]:
    """The values a job stored under ``<prefix>/rank0``, ``<prefix>/rank1``, ... in rank order, up
    to the first rank without one (``start_debug_server`` registers each rank's URL so).

    Read with torch's client (a ``PrefixStore``); raises ImportError without torch and OSError
    when the store cannot be reached.
    """
    from torch._C._distributed_c10d import PrefixStore

    prefixed = PrefixStore(prefix, _torch_client(host, port, timeout))
    values: list[str] = []
    while len(values) < limit and prefixed.check([f"rank{len(values)}"]):
        values.append(prefixed.get(f"rank{len(values)}").decode())
    return values


__all__ = ["StoreProtocolError", "rank_values", "read_key", "read_key_with_torch"]
