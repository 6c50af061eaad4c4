"""The sockets rankscope opens itself, each bounded by a timeout and closed before returning.

A free port for torchrun's rendezvous, the IPv4 address of an interface (an ioctl on a UDP
socket that sends nothing), and one HTTP ``POST`` to a torch worker server, over TCP
(``start_debug_server``'s per-rank servers) or over a unix socket (torchelastic's
``TORCH_WORKER_SERVER_SOCKET``). They live here, with the other code that reaches outside
rankscope's process, so the capability shells only decide what to ask and what the answer means.
The store's and NCCL RAS's own protocols have their own modules (``tcpstore``, ``ras_client``).
"""

from __future__ import annotations

import fcntl
import http.client
import socket
import struct

SIOCGIFADDR = 0x8915
"""The ioctl that reads an interface's IPv4 address (Linux)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (bound, read, released): another process may take it
    before the caller binds it, so callers retry on "address in use"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def resolve(name: str, timeout: float = 2.0) -> list[str]:
    """The addresses ``name`` resolves to on this host (sorted, once each); empty when it does not
    resolve within ``timeout`` seconds (the lookup runs in a thread left behind, a daemon)."""
    import threading

    found: list[str] = []

    def look() -> None:
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            return
        found.extend(sorted({str(info[4][0]) for info in infos}))

    worker = threading.Thread(target=look, name="rankscope-resolve", daemon=True)
    worker.start()
    worker.join(timeout)
    return list(found) if not worker.is_alive() else []


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of interface ``name``, or None when it has none (or is gone)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def http_post(url: str, timeout: float, limit: int) -> bytes:
    """The body (at most ``limit`` bytes) a ``POST`` to ``url`` with an empty body answers.

    Raises what urllib raises (URLError, HTTPError, a timeout): the caller words one rank's
    failure without hiding the others. urllib is imported here, on the first call: most
    captures never post anything.
    """
    import urllib.request

    req = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data: bytes = resp.read(limit)
        return data


class _UnixHTTPConnection(http.client.HTTPConnection):
    """http.client's connection, over a unix socket instead of TCP."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def http_post_unix(path: str, route: str, timeout: float, limit: int) -> tuple[int, bytes]:
    """(status, body of at most ``limit`` bytes) of a ``POST route`` with an empty body to the
    HTTP server on the unix socket ``path``. Raises OSError or http.client.HTTPException."""
    conn = _UnixHTTPConnection(path, timeout)
    try:
        conn.request("POST", route, body=b"")
        resp = conn.getresponse()
        return resp.status, resp.read(limit)
    finally:
        conn.close()


__all__ = ["free_port", "http_post", "http_post_unix", "interface_ipv4"]
