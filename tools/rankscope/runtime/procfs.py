"""Readers for /proc/PID/*: the one place that knows the layout of procfs.

Discovery, environment collection, memory, the launcher's watchdog and the
process-tree reaper all need the same few facts about a process (parent,
state, start time, command line, environment, interpreter). They read them
here, so the parsing rules (``comm`` may hold spaces and parentheses,
``environ``/``cmdline`` are NUL-separated bytes of any encoding) live once.

Read-only, never blocking: every function reads one small file. The plain
``read_*`` functions return None (or an empty value) when the process is gone
or unreadable; the bare-noun ones (``environ``, ``cmdline``, ``text``) raise
``OSError`` so a caller can tell "permission denied" from "gone".

One capture asks several modules about the same ranks (discovery, the redactor, the GPU reader,
the recorder pickup). Inside ``with reading_once():`` the facts that stay put while a process
runs (its open files, environment, command line, executable, working directory, start time,
thread names and mapped files) are read once per pid; the facts of a moment (stat's state and
CPU time, I/O counters, kernel waits, ``status``) are read afresh every time, so a rank that
exits mid-capture still reads as gone. Outside a scope nothing is kept: the long-lived MCP
server never answers from stale facts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from rankscope.analysis.code_origin import roots_of
from rankscope.analysis.hang.backend import ProcessSigns

if TYPE_CHECKING:
    from rankscope.models.core import CodeRoots, ProcState

PROC = Path("/proc")

STATES: dict[str, ProcState] = {
    "R": "running",
    "S": "sleeping",
    "D": "disk_sleep",
    "T": "stopped",
    "t": "tracing_stop",
    "Z": "zombie",
    "X": "dead",
    "x": "dead",
    "I": "idle",
}


def path(pid: int, name: str) -> Path:
    """``/proc/PID/NAME``."""
    return PROC / str(pid) / name


# -- the three raw accesses: every read of /proc/PID goes through one of them -----------------------


def _read_bytes(file: Path) -> bytes:
    """The bytes of one /proc file (one place, so that the reads can be counted)."""
    with open(file, "rb") as fh:
        return fh.read()


def _listdir(folder: Path) -> list[str]:
    """The names in one /proc folder (``fd``, ``task``)."""
    return os.listdir(folder)


def _readlink(link: Path) -> str:
    """The target of one /proc link (``exe``, ``cwd``, ``fd/N``)."""
    return os.readlink(link)


# -- the scope: what does not change during one capture is read once --------------------------------

_T = TypeVar("_T")

STABLE_FILES = frozenset({"environ", "cmdline", "maps"})
"""The files of /proc/PID whose content a process does not change while one capture looks at it;
read once per pid inside :func:`reading_once` (with the fd walk, ``exe``, ``cwd``, the start time
and the thread names). Never ``stat``, ``io``, ``wchan``, ``syscall`` or ``status``: they measure a
moment, and the progress window compares two of them."""


@dataclass(frozen=True)
class _Failed:
    """A read that failed, kept so that the next caller sees the same refusal (or absence)."""

    error: OSError


_MEMO: ContextVar[dict[tuple[str, int], object] | None] = ContextVar("rankscope_procfs_memo", default=None)


@contextlib.contextmanager
def reading_once() -> Iterator[None]:
    """Within this scope each stable fact of a process (see :data:`STABLE_FILES`) is read once per
    pid, whoever asks for it; a scope opened inside another one shares the outer one's facts. One
    host's capture runs inside one scope; outside any scope every call reads /proc again."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def _once(fact: str, pid: int, read: Callable[[], _T]) -> _T:
    """``read()``, kept for ``(fact, pid)`` while a :func:`reading_once` scope is open (its
    ``OSError`` too, raised again to the next caller); called every time outside a scope."""
    memo = _MEMO.get()
    if memo is None:
        return read()
    key = (fact, pid)
    if key not in memo:
        try:
            memo[key] = read()
        except OSError as exc:
            memo[key] = _Failed(exc)
    got = memo[key]
    if isinstance(got, _Failed):
        raise got.error.with_traceback(None)
    return cast(_T, got)


def _file(pid: int, name: str) -> bytes:
    """The bytes of ``/proc/PID/NAME``, read once per scope for :data:`STABLE_FILES`; raises OSError."""
    if name in STABLE_FILES:
        return _once(name, pid, lambda: _read_bytes(path(pid, name)))
    return _read_bytes(path(pid, name))


def _link(pid: int, name: str) -> str | None:
    """The target of ``/proc/PID/NAME`` (``exe``, ``cwd``: read once per scope), or None when unreadable."""

    def read() -> str | None:
        try:
            return _readlink(path(pid, name))
        except OSError:
            return None

    return _once(f"link:{name}", pid, read)


def pids() -> Iterator[int]:
    """Every pid currently listed in /proc (processes may vanish while iterating)."""
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def text(pid: int, name: str) -> str:
    """The text of ``/proc/PID/NAME``; raises OSError when gone or unreadable."""
    return _file(pid, name).decode(errors="replace")


def read_text(pid: int, name: str) -> str | None:
    """The text of ``/proc/PID/NAME``, or None when gone or unreadable."""
    try:
        return text(pid, name)
    except OSError:
        return None


def host_text(name: str) -> str | None:
    """The text of the host-wide ``/proc/NAME`` (``meminfo``, ``net/if_inet6``), or None when unreadable."""
    try:
        return (PROC / name).read_text(errors="replace")
    except OSError:
        return None


def host_has(name: str) -> bool:
    """Whether ``/proc/NAME`` exists (``driver/nvidia``: the NVIDIA driver is loaded)."""
    return (PROC / name).exists()


def own_text(name: str) -> str:
    """The text of ``/proc/self/NAME``: the calling process's own file (the probe, inside a rank,
    reads its ``status``); raises OSError when unreadable."""
    return (PROC / "self" / name).read_text()


_START_FIELD = 19
"""``starttime`` (field 22 of /proc/PID/stat) in :func:`stat_fields`' numbering."""


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after ``comm`` (state is [0], ppid [1]), or None when gone.

    ``comm`` may contain spaces and parentheses, so the split starts after the last ')'.
    Never kept (state and CPU time change); inside a scope its start time is noted, for
    :func:`start_epoch`.
    """
    try:
        stat = _read_bytes(path(pid, "stat")).decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    memo = _MEMO.get()
    if memo is not None and len(fields) > _START_FIELD and fields[_START_FIELD].isdigit():
        memo.setdefault(("start", pid), int(fields[_START_FIELD]))
    return fields


def read_stat(pid: int) -> tuple[int | None, ProcState, int] | None:
    """(ppid, state, start time in clock ticks) from /proc/PID/stat, or None when gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[1]), STATES.get(fields[0], "unknown"), int(fields[_START_FIELD])
    except (IndexError, ValueError):
        return None


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """CPU time the process used so far, user + system, in seconds (/proc/PID/stat utime, stime);
    None when gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (IndexError, ValueError):
        return None


def cpu_of(fields: list[str]) -> float:
    """User + system CPU seconds from :func:`stat_fields` already read (0.0 where unreadable), so a
    sampler that reads the state reads the stat file once."""
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (IndexError, ValueError):
        return 0.0


IO_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")
"""The I/O counters of /proc/PID/task/TID/io kept: bytes through read/write calls, the calls, and
the bytes that reached (or came from) storage."""


def queued_seconds(pid: int) -> float | None:
    """Seconds the main thread has spent runnable but waiting for a core (/proc/PID/schedstat, its
    second field, in ns): a rank that lags only because the host's cores are oversubscribed queues
    there, while one that lags from its own work runs. None where the kernel keeps no schedstat."""
    raw = read_text(pid, "schedstat")
    fields = raw.split() if raw else []
    try:
        return int(fields[1]) / 1e9
    except (IndexError, ValueError):
        return None


def _io_fields(raw: str | None, prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (raw or "").splitlines():
        name, _, value = line.partition(":")
        if name.strip() in IO_FIELDS and value.strip().isdigit():
            out[prefix + name.strip()] = int(value)
    return out


def io_counters(pid: int, tid: int | None = None) -> dict[str, int] | None:
    """One thread's I/O counters (``tid``, by default the main thread: its tid is the pid), so that
    the threads of the collective transport (gloo's workers, NCCL's proxy) never count; the
    process's own /proc/PID/io where the kernel keeps no per-thread file. With them, the whole
    process's bytes from and to storage (``process_read_bytes``, ``process_write_bytes``: sockets
    never count there), which a writer thread of its own moves. None when gone or unreadable."""
    whole = read_text(pid, "io")
    out = _io_fields(read_text(pid, f"task/{tid or pid}/io") or whole)
    if not out:
        return None
    storage = _io_fields(whole, "process_")
    out.update({k: v for k, v in storage.items() if k in ("process_read_bytes", "process_write_bytes")})
    return out


def kernel_wait(pid: int, tid: int | None = None) -> tuple[str, str] | None:
    """Where one thread (by default the main thread) is in the kernel: its state letter (``R``
    running, ``S`` sleeping, ``D`` uninterruptible, mostly disk) and the kernel function it sleeps in,
    from /proc/PID/task/TID/wchan (``hrtimer_nanosleep``, ``futex_wait_queue``; ``""`` while it runs
    or where the kernel hides the names). None when gone or unreadable."""
    stat = read_text(pid, f"task/{tid or pid}/stat")
    raw = read_text(pid, f"task/{tid or pid}/wchan")
    if stat is None or raw is None or ")" not in stat:
        return None
    state = stat.rpartition(")")[2].split()[:1]
    name = raw.strip()
    return (state[0] if state else "?", "" if name == "0" else name)


_EXIT_CODE_FIELD = 49
"""``exit_code`` (field 52 of /proc/PID/stat, Linux 3.5+) in :func:`stat_fields`' numbering."""


def exit_code(pid: int) -> int | None:
    """How an exited, not yet reaped process ended: its exit code, or minus the signal that killed
    it (as subprocess reports it), read from its zombie's /proc/PID/stat; None when it runs, is
    gone, or the kernel does not say."""
    fields = stat_fields(pid)
    if fields is None or fields[0] not in ("Z", "X") or len(fields) <= _EXIT_CODE_FIELD:
        return None
    try:
        status = int(fields[_EXIT_CODE_FIELD])
    except ValueError:
        return None
    return -(status & 0x7F) if status & 0x7F else status >> 8


def ended_phrase(code: int) -> str:
    """``exit code 1`` or ``killed by SIGKILL`` for an :func:`exit_code`."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def exit_status(pid: int) -> str | None:
    """:func:`exit_code` in words (``exit code 1``, ``killed by SIGKILL``), or None."""
    code = exit_code(pid)
    return None if code is None else ended_phrase(code)


def start_epoch(pid: int) -> float | None:
    """When the process started, in seconds since the epoch, or None when it is gone.

    Read as its age (``/proc/uptime`` minus the start ticks in ``stat``) taken from now, which
    does not depend on ``btime`` (whole seconds, and off after the wall clock was stepped).
    Inside a :func:`reading_once` scope it is read once per pid (and then stays, even once the
    process is gone: :func:`proc_state` and :func:`is_alive` say that).
    """
    return _once("start_epoch", pid, lambda: _epoch_of(_once("start", pid, lambda: _start_ticks(pid))))


def _start_ticks(pid: int) -> int | None:
    stat = read_stat(pid)
    return None if stat is None else stat[2]


def _epoch_of(ticks: int | None) -> float | None:
    """The epoch of a start time in clock ticks since boot (None: None)."""
    if ticks is None:
        return None
    try:
        with open(PROC / "uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    age = uptime - ticks / _TICKS
    return time.time() - max(age, 0.0)


def parent_of(pid: int) -> int | None:
    """The parent pid from /proc/PID/stat, or None when the process is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def proc_state(pid: int) -> ProcState | None:
    """The process state letter mapped to a ProcState, or None when the process is gone."""
    stat = read_stat(pid)
    return stat[1] if stat else None


def is_alive(pid: int) -> bool:
    """True while the process exists and is neither a zombie nor dead."""
    fields = stat_fields(pid)
    if fields is None:
        return False
    return (fields[0][:1] if fields else "") not in ("Z", "X")


def parse_environ(raw: bytes) -> dict[str, str]:
    """NUL-separated ``KEY=VALUE`` bytes (/proc/PID/environ) to a dict; undecodable bytes replaced."""
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def environ(pid: int) -> dict[str, str]:
    """The process's initial environment; raises OSError (PermissionError for another user's process)."""
    return parse_environ(_file(pid, "environ"))


def read_environ(pid: int) -> dict[str, str] | None:
    """The process's initial environment; None when unreadable (other user, gone, zombie)."""
    try:
        return environ(pid)
    except OSError:
        return None


def cmdline(pid: int) -> list[str]:
    """argv of the process (empty for zombies and kernel threads); raises OSError when gone."""
    raw = _file(pid, "cmdline")
    return [w.decode(errors="replace") for w in raw.split(b"\0") if w]


def read_cmdline(pid: int) -> list[str]:
    """argv of the process, or [] when gone or unreadable."""
    try:
        return cmdline(pid)
    except OSError:
        return []


def read_exe(pid: int) -> str | None:
    """The executable the process runs (/proc/PID/exe), or None when unreadable."""
    return _link(pid, "exe")


def read_cwd(pid: int) -> str | None:
    """The process's working directory (/proc/PID/cwd), or None when unreadable."""
    return _link(pid, "cwd")


def _maps_lines(pid: int) -> list[bytes]:
    """The lines of /proc/PID/maps (read once per scope); empty when unreadable."""
    try:
        return _file(pid, "maps").splitlines()
    except OSError:
        return []


def maps_mention(pid: int, needles: tuple[bytes, ...]) -> bool:
    """True when a line of /proc/PID/maps contains one of ``needles``."""
    return any(any(n in line for n in needles) for line in _maps_lines(pid))


_SIGN_WORDS = (b"nccl", b"cuda", b"/dev/nvidia", b"/dev/shm/")
MAX_FDS = 4096
"""Open fds read per process at most (a rank may hold thousands)."""


def thread_names(pid: int) -> tuple[str, ...]:
    """The names of the process's threads (/proc/PID/task/*/comm; read once per scope); empty when
    unreadable."""

    def read() -> tuple[str, ...]:
        names: list[str] = []
        try:
            tids = _listdir(path(pid, "task"))
        except OSError:
            return ()
        for tid in tids:
            with contextlib.suppress(OSError):
                names.append(_read_bytes(path(pid, f"task/{tid}/comm")).decode(errors="replace").strip())
        return tuple(names)

    return _once("threads", pid, read)


def mapped_paths(pid: int, words: tuple[bytes, ...] = _SIGN_WORDS) -> frozenset[str]:
    """The mapped file paths of /proc/PID/maps that contain one of ``words``."""
    found: set[str] = set()
    for line in _maps_lines(pid):
        if any(w in line for w in words):
            parts = line.split(maxsplit=5)
            if len(parts) == 6:
                found.add(parts[5].strip().decode(errors="replace"))
    return frozenset(found)


def fd_targets(pid: int) -> tuple[tuple[str, str], ...]:
    """(``/proc/PID/fd/N``, link target) of the process's open fds, at most :data:`MAX_FDS` read:
    the one walk over its open files, read once per :func:`reading_once` scope; empty when gone or
    unreadable. The ``/proc`` path opens the very file the process holds, whatever its mount
    namespace."""

    def read() -> tuple[tuple[str, str], ...]:
        try:
            fds = _listdir(path(pid, "fd"))
        except OSError:
            return ()
        out: list[tuple[str, str]] = []
        for fd in fds[:MAX_FDS]:
            link = path(pid, f"fd/{fd}")
            with contextlib.suppress(OSError):
                out.append((os.fspath(link), _readlink(link)))
        return tuple(out)

    return _once("fds", pid, read)


def output_files(pid: int) -> list[str]:
    """The regular files the process's stderr and stdout go to (fd 2, then fd 1; from
    :func:`fd_targets`): a launcher's log; never a terminal, a pipe or a /proc file."""
    targets = dict(fd_targets(pid))
    out: list[str] = []
    for fd in (2, 1):
        target = targets.get(os.fspath(path(pid, f"fd/{fd}")))
        if (
            target
            and target.startswith("/")
            and not target.startswith(("/dev/", "/proc/"))
            and target not in out
        ):
            out.append(target)
    return out


def device_fds(pid: int, prefix: str = "/dev/") -> tuple[str, ...]:
    """Targets of the process's open fds under ``prefix`` (from :func:`fd_targets`)."""
    return tuple(target for _, target in fd_targets(pid) if target.startswith(prefix))


def open_files(pid: int, name_prefix: str) -> tuple[tuple[str, str], ...]:
    """(``/proc/PID/fd/N``, target) of the open fds whose file name starts with ``name_prefix``
    (from :func:`fd_targets`)."""
    return tuple(pair for pair in fd_targets(pid) if os.path.basename(pair[1]).startswith(name_prefix))


def socket_inodes(pid: int) -> frozenset[int]:
    """Inodes of the process's open sockets (``socket:[N]`` fd links, from :func:`fd_targets`)."""
    return frozenset(
        int(target[8:-1])
        for _, target in fd_targets(pid)
        if target.startswith("socket:[") and target.endswith("]") and target[8:-1].isdigit()
    )


_LISTEN = "0A"
_ANY6 = "0" * 32


def listens_on_any_ipv6(pid: int) -> bool:
    """Whether the process holds a TCP socket listening on ``[::]`` (all addresses, IPv6).

    torch's debug server binds each rank's worker server there (``_WorkerServer("::", port)``);
    gloo and NCCL bind their listeners to one interface's address. A cheap sign, read before
    anything costlier is tried.
    """
    table = read_text(pid, "net/tcp6")
    if not table:
        return False
    listening: set[int] = set()
    for line in table.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 9 and cols[3] == _LISTEN and cols[1].split(":")[0] == _ANY6 and cols[9].isdigit():
            listening.add(int(cols[9]))
    return bool(listening & socket_inodes(pid))


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket of this host's network namespace (/proc/net/tcp, tcp6)."""

    local: str
    port: int
    remote: str
    remote_port: int
    listening: bool
    established: bool
    inode: int


def _address(hexed: str) -> str:
    """An address of /proc/net/tcp (little-endian 32-bit words in hex) in its usual form."""
    raw = bytes.fromhex(hexed)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def tcp_sockets(ports: frozenset[int] | None) -> list[TcpSocket]:
    """The TCP sockets of this host (its network namespace) whose local or remote port is one of
    ``ports`` (None: every socket): who listens at a store's port, and how many connections reach it."""
    out: list[TcpSocket] = []
    for name in ("net/tcp", "net/tcp6"):
        for line in (host_text(name) or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) < 10 or not cols[9].isdigit():
                continue
            try:
                (lhex, lport), (rhex, rport) = (c.split(":") for c in cols[1:3])
                sock = TcpSocket(
                    _address(lhex),
                    int(lport, 16),
                    _address(rhex),
                    int(rport, 16),
                    cols[3] == _LISTEN,
                    cols[3] == "01",
                    int(cols[9]),
                )
            except ValueError:
                continue
            if ports is None or sock.port in ports or sock.remote_port in ports:
                out.append(sock)
    return out


def caught_signals(pid: int) -> frozenset[int]:
    """Signals the process has a handler for (``SigCgt`` in /proc/PID/status); empty when unreadable."""
    status = read_text(pid, "status") or ""
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split(":", 1)[1].strip() or "0", 16)
            return frozenset(n + 1 for n in range(64) if mask >> n & 1)
    return frozenset()


_ROOT_WORDS = (b"lib-dynload", b"site-packages", b"dist-packages", b"libpython", b"torch/lib/")
"""The mapped files that say where an interpreter imports from (:func:`code_roots`)."""


def code_roots(pid: int) -> CodeRoots | None:
    """Where the process's interpreter imports its code from (read once per scope), from its
    executable, command line, environment and mapped files: no ptrace, nothing run in it. None
    when the process is gone or unreadable."""

    def read() -> CodeRoots | None:
        exe = read_exe(pid)
        if exe is None:
            return None
        argv = read_cmdline(pid)
        env = read_environ(pid) or {}
        return roots_of(exe, argv[0] if argv else None, env, sorted(mapped_paths(pid, _ROOT_WORDS)))

    return _once("roots", pid, read)


def process_signs(pid: int, env: dict[str, str] | None = None) -> ProcessSigns:
    """What /proc shows of a rank's backend (see :mod:`rankscope.analysis.hang.backend`); no ptrace."""
    return ProcessSigns(
        threads=thread_names(pid),
        mapped=mapped_paths(pid),
        fds=device_fds(pid, "/dev/nvidia"),
        env=env or {},
    )


__all__ = [
    "IO_FIELDS",
    "PROC",
    "STABLE_FILES",
    "STATES",
    "TcpSocket",
    "caught_signals",
    "cmdline",
    "code_roots",
    "device_fds",
    "environ",
    "fd_targets",
    "host_has",
    "host_text",
    "io_counters",
    "is_alive",
    "kernel_wait",
    "listens_on_any_ipv6",
    "mapped_paths",
    "maps_mention",
    "open_files",
    "output_files",
    "own_text",
    "parent_of",
    "parse_environ",
    "path",
    "pids",
    "proc_state",
    "process_signs",
    "queued_seconds",
    "read_cmdline",
    "read_environ",
    "read_exe",
    "read_stat",
    "read_text",
    "reading_once",
    "socket_inodes",
    "start_epoch",
    "stat_fields",
    "tcp_sockets",
    "text",
    "thread_names",
]
