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
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rankscope.analysis.hang.backend import ProcessSigns

if TYPE_CHECKING:
    from rankscope.models.core import ProcState

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


def pids() -> Iterator[int]:
    """Every pid currently listed in /proc (processes may vanish while iterating)."""
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def text(pid: int, name: str) -> str:
    """The text of ``/proc/PID/NAME``; raises OSError when gone or unreadable."""
    return path(pid, name).read_text(errors="replace")


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


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after ``comm`` (state is [0], ppid [1]), or None when gone.

    ``comm`` may contain spaces and parentheses, so the split starts after the last ')'.
    """
    try:
        stat = path(pid, "stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def read_stat(pid: int) -> tuple[int | None, ProcState, int] | None:
    """(ppid, state, start time in clock ticks) from /proc/PID/stat, or None when gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[1]), STATES.get(fields[0], "unknown"), int(fields[19])
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


IO_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")
"""The I/O counters of /proc/PID/task/TID/io kept: bytes through read/write calls, the calls, and
the bytes that reached (or came from) storage."""


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
    """
    stat = read_stat(pid)
    if stat is None:
        return None
    try:
        with open(PROC / "uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    age = uptime - stat[2] / os.sysconf("SC_CLK_TCK")
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
    return parse_environ(path(pid, "environ").read_bytes())


def read_environ(pid: int) -> dict[str, str] | None:
    """The process's initial environment; None when unreadable (other user, gone, zombie)."""
    try:
        return environ(pid)
    except OSError:
        return None


def cmdline(pid: int) -> list[str]:
    """argv of the process (empty for zombies and kernel threads); raises OSError when gone."""
    raw = path(pid, "cmdline").read_bytes()
    return [w.decode(errors="replace") for w in raw.split(b"\0") if w]


def read_cmdline(pid: int) -> list[str]:
    """argv of the process, or [] when gone or unreadable."""
    try:
        return cmdline(pid)
    except OSError:
        return []


def read_exe(pid: int) -> str | None:
    """The executable the process runs (/proc/PID/exe), or None when unreadable."""
    try:
        return os.readlink(path(pid, "exe"))
    except OSError:
        return None


def read_cwd(pid: int) -> str | None:
    """The process's working directory (/proc/PID/cwd), or None when unreadable."""
    try:
        return os.readlink(path(pid, "cwd"))
    except OSError:
        return None


def maps_mention(pid: int, needles: tuple[bytes, ...]) -> bool:
    """True when a line of /proc/PID/maps contains one of ``needles`` (streamed: maps can be large)."""
    try:
        with open(path(pid, "maps"), "rb") as fh:
            return any(any(n in line for n in needles) for line in fh)
    except OSError:
        return False


_SIGN_WORDS = (b"nccl", b"cuda", b"/dev/nvidia", b"/dev/shm/")
MAX_FDS = 4096
"""Open fds read per process at most when looking for /dev/nvidia* (a rank may hold thousands)."""


def thread_names(pid: int) -> tuple[str, ...]:
    """The names of the process's threads (/proc/PID/task/*/comm); empty when unreadable."""
    names: list[str] = []
    try:
        tids = os.listdir(path(pid, "task"))
    except OSError:
        return ()
    for tid in tids:
        try:
            with open(path(pid, f"task/{tid}/comm"), encoding="utf-8", errors="replace") as fh:
                names.append(fh.read().strip())
        except OSError:
            continue
    return tuple(names)


def mapped_paths(pid: int, words: tuple[bytes, ...] = _SIGN_WORDS) -> frozenset[str]:
    """The mapped file paths of /proc/PID/maps that contain one of ``words`` (streamed)."""
    found: set[str] = set()
    try:
        with open(path(pid, "maps"), "rb") as fh:
            for line in fh:
                if any(w in line for w in words):
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6:
                        found.add(parts[5].strip().decode(errors="replace"))
    except OSError:
        return frozenset()
    return frozenset(found)


def device_fds(pid: int, prefix: str = "/dev/") -> tuple[str, ...]:
    """Targets of the process's open fds under ``prefix`` (at most :data:`MAX_FDS` read)."""
    out: list[str] = []
    try:
        fds = os.listdir(path(pid, "fd"))
    except OSError:
        return ()
    for fd in fds[:MAX_FDS]:
        try:
            target = os.readlink(path(pid, f"fd/{fd}"))
        except OSError:
            continue
        if target.startswith(prefix):
            out.append(target)
    return tuple(out)


def open_files(pid: int, name_prefix: str) -> tuple[tuple[str, str], ...]:
    """(``/proc/PID/fd/N``, target) of the open fds whose file name starts with ``name_prefix``.

    The ``/proc`` path opens the very file the process holds, whatever its mount namespace.
    """
    out: list[tuple[str, str]] = []
    try:
        fds = os.listdir(path(pid, "fd"))
    except OSError:
        return ()
    for fd in fds[:MAX_FDS]:
        link = path(pid, f"fd/{fd}")
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if os.path.basename(target).startswith(name_prefix):
            out.append((os.fspath(link), target))
    return tuple(out)


def socket_inodes(pid: int) -> frozenset[int]:
    """Inodes of the process's open sockets (``socket:[N]`` fd links; at most :data:`MAX_FDS` read)."""
    found: set[int] = set()
    try:
        fds = os.listdir(path(pid, "fd"))
    except OSError:
        return frozenset()
    for fd in fds[:MAX_FDS]:
        try:
            target = os.readlink(path(pid, f"fd/{fd}"))
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            found.add(int(target[8:-1]))
    return frozenset(found)


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


def caught_signals(pid: int) -> frozenset[int]:
    """Signals the process has a handler for (``SigCgt`` in /proc/PID/status); empty when unreadable."""
    status = read_text(pid, "status") or ""
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split(":", 1)[1].strip() or "0", 16)
            return frozenset(n + 1 for n in range(64) if mask >> n & 1)
    return frozenset()


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
    "STATES",
    "caught_signals",
    "cmdline",
    "device_fds",
    "environ",
    "host_has",
    "host_text",
    "io_counters",
    "is_alive",
    "kernel_wait",
    "listens_on_any_ipv6",
    "mapped_paths",
    "maps_mention",
    "open_files",
    "own_text",
    "parent_of",
    "parse_environ",
    "path",
    "pids",
    "proc_state",
    "process_signs",
    "read_cmdline",
    "read_environ",
    "read_exe",
    "read_stat",
    "read_text",
    "socket_inodes",
    "start_epoch",
    "stat_fields",
    "text",
    "thread_names",
]
