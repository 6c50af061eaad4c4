"""Where a process sleeps in the kernel: ``/proc/PID/wchan``, the syscall it is in
(``/proc/PID/syscall``) and the file that syscall is on: the path it opens (read from
``/proc/PID/mem``, which needs the same ptrace access py-spy already has) or the fd it reads
(``/proc/PID/fd/N``), that file's type (FIFO, socket, regular file) and its file system type
(``/proc/PID/mountinfo``: nfs4, ext4, ...).

A DataLoader worker that opens a named pipe with no writer sleeps at ``wait_for_partner`` in
``openat``; one reading a dead NFS mount sleeps in ``rpc_wait_bit_killable``: what a rank's
stack alone cannot show. Every read is best effort: a fact that cannot be read stays None.
"""

from __future__ import annotations

import os
import platform
import stat
import time

from rankscope.analysis.hang.workers import KernelWait
from rankscope.runtime.procfs import path, read_text

SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {
        0: "read",
        2: "open",
        4: "stat",
        7: "poll",
        17: "pread64",
        19: "readv",
        23: "select",
        42: "connect",
        43: "accept",
        45: "recvfrom",
        47: "recvmsg",
        61: "wait4",
        74: "fsync",
        202: "futex",
        232: "epoll_wait",
        257: "openat",
        262: "newfstatat",
        270: "pselect6",
        271: "ppoll",
        281: "epoll_pwait",
        288: "accept4",
        332: "statx",
        437: "openat2",
    },
    "aarch64": {
        22: "epoll_pwait",
        56: "openat",
        63: "read",
        65: "readv",
        67: "pread64",
        72: "pselect6",
        73: "ppoll",
        79: "newfstatat",
        82: "fsync",
        98: "futex",
        202: "accept",
        203: "connect",
        207: "recvfrom",
        212: "recvmsg",
        242: "accept4",
        260: "wait4",
        291: "statx",
        437: "openat2",
    },
}
"""Syscall numbers of the calls a blocked reader sits in, by machine (from the kernel's tables)."""

PATH_ARG: dict[str, int] = {"open": 0, "stat": 0, "openat": 1, "openat2": 1, "newfstatat": 1, "statx": 1}
"""Which argument of a syscall is the path it opens."""

FD_ARG = frozenset(
    {"read", "pread64", "readv", "recvfrom", "recvmsg", "accept", "accept4", "connect", "fsync"}
)
"""Syscalls whose first argument is the fd they wait on."""

MAX_PATH = 4096


def _syscall(pid: int, task: str) -> tuple[str | None, list[int]]:
    """The syscall's name and arguments from ``/proc/PID/syscall`` (``257 0xffffff9c 0x7f... ...``)."""
    raw = (read_text(pid, f"{task}syscall") or "").split()
    if not raw or not raw[0].isdigit():
        return None, []
    names = SYSCALLS.get(platform.machine(), {})
    try:
        args = [int(a, 16) for a in raw[1:7]]
    except ValueError:
        args = []
    return names.get(int(raw[0]), f"syscall {raw[0]}"), args


def _string_at(pid: int, address: int) -> str | None:
    """The NUL-terminated string at ``address`` in the process's memory, or None."""
    try:
        with open(path(pid, "mem"), "rb", buffering=0) as mem:
            mem.seek(address)
            data = mem.read(MAX_PATH)
    except (OSError, ValueError, OverflowError):
        return None
    text = data.split(b"\0", 1)[0]
    return text.decode(errors="replace") if text else None


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISCHR(mode):
        return "device"
    return "file"


def _fstype(pid: int, file: str) -> str | None:
    """The file system type of the mount that holds ``file`` (the longest mount point above it)."""
    best, found = -1, None
    for line in (read_text(pid, "mountinfo") or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        point = fields[4]
        if (file == point or file.startswith(point.rstrip("/") + "/")) and len(point) > best:
            best, found = len(point), right.split()[0]
    return found


def _opened(pid: int, name: str, args: list[int]) -> tuple[str | None, str | None]:
    """The path a syscall opens, and its type (followed inside the process's own root)."""
    where = PATH_ARG.get(name)
    file = _string_at(pid, args[where]) if where is not None and len(args) > where else None
    if file is None:
        return None, None
    seen = (
        os.fspath(path(pid, "root")) + file if file.startswith("/") else os.path.join(path(pid, "cwd"), file)
    )
    try:
        return file, _kind(os.stat(seen).st_mode)
    except OSError:
        return file, None


def _on_fd(pid: int, args: list[int]) -> tuple[str | None, str | None]:
    """The target and type of the fd a syscall waits on."""
    if not args:
        return None, None
    link = path(pid, f"fd/{args[0]}")
    try:
        target = os.readlink(link)
    except OSError:
        return None, None
    if target.startswith("pipe:"):
        return target, "pipe"
    if target.startswith("socket:"):
        return target, "socket"
    try:
        return target, _kind(os.stat(link).st_mode)
    except OSError:
        return target, None


def kernel_wait(pid: int, tid: int | None = None) -> KernelWait:
    """Where ``pid`` (its thread ``tid``, when given) sleeps in the kernel, and on what file (each
    fact None when it cannot be read). A thread shares its process's memory and fds."""
    task = f"task/{tid}/" if tid is not None else ""
    wchan = (read_text(pid, f"{task}wchan") or "").strip() or None
    name, args = _syscall(pid, task)
    file, kind = (None, None)
    if name in PATH_ARG:
        file, kind = _opened(pid, name, args)
    elif name in FD_ARG:
        file, kind = _on_fd(pid, args)
    fstype = _fstype(pid, file) if file and file.startswith("/") else None
    return KernelWait(wchan=wchan, syscall=name, path=file, kind=kind, fstype=fstype)


SETTLE_TRIES = 5
SETTLE_PAUSE_S = 0.05
"""A process py-spy has just let go restarts the syscall it was in: a few short looks (0.25 s at
most) find it asleep again, where it sleeps at all."""


def settled_kernel_wait(pid: int, tid: int | None = None) -> KernelWait:
    """:func:`kernel_wait`, looked at again a few times while the process is not asleep in the kernel
    (a running process stays running: its last look is returned)."""
    wait = kernel_wait(pid, tid)
    for _ in range(SETTLE_TRIES - 1):
        if wait.wchan not in (None, "0"):
            break
        time.sleep(SETTLE_PAUSE_S)
        wait = kernel_wait(pid, tid)
    return wait


__all__ = ["kernel_wait", "settled_kernel_wait"]
