"""What a suspect rank waits on when it waits on its own children: its DataLoader workers.

A rank blocked in ``_BaseDataLoaderIter.__next__`` (or a multiprocessing queue fed by its own
children) is not stuck itself: one of its workers is, reading the data. The shell dumps the
rank's children in the same call and reads where each waits in the kernel (``/proc/PID/wchan``,
the syscall and the file it is on); this module decides which worker is the one the rank waits
on and says so: the worker's own line, and what it waits on (a FIFO with no writer, a socket,
NFS, a lock).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rankscope.analysis.hang.frames import is_user_frame, short_path
from rankscope.models.core import Frame

MAX_WORKERS = 8
"""Children dumped at most in one call, over every suspect: a DataLoader rarely has more, and each
dump costs time."""

_WAITS_ON_CHILDREN = (
    "torch/utils/data/dataloader.py",
    "multiprocessing/queues.py",
    "multiprocessing/connection.py",
)
"""Files a rank's main thread is in when it waits on what its children send (a DataLoader's queue)."""

_WAITS_ON_THREADS = ("/queue.py", "/threading.py")
"""Stdlib files a main thread is in when it waits on its own threads (``queue.Queue.get``, an
``Event``, a ``join``): the innermost Python frame tells."""

_WORKER_LOOP = "torch/utils/data/_utils/worker.py"
"""The DataLoader worker's loop: the frames below it are its parent's, inherited by the fork."""

_FETCH = "torch/utils/data/_utils/fetch.py"
"""torch's fetcher: a worker with it on its stack is getting a batch from the dataset."""

_WORKER_IDLE = ("multiprocessing/queues.py", "multiprocessing/connection.py", "/queue.py")
"""Files a worker is in when it waits for work from its rank, not on data."""


@dataclass(frozen=True)
class KernelWait:
    """Where a process sleeps in the kernel, as /proc shows it: ``wchan``, the syscall and the file
    it is on (``path``, its ``kind``: fifo, socket, file, ...; ``fstype``: nfs4, ext4, ...)."""

    wchan: str | None = None
    syscall: str | None = None
    path: str | None = None
    kind: str | None = None
    fstype: str | None = None


def waits_on_children(frames: list[Frame]) -> bool:
    """True when a main thread waits on what its children send (a DataLoader's next batch)."""
    return any(
        not f.native and any(f.file.replace("\\", "/").endswith(p) for p in _WAITS_ON_CHILDREN)
        for f in frames
    )


def waits_on_threads(frames: list[Frame]) -> bool:
    """True when a main thread waits on a queue or an event its own threads feed (stdlib queue/threading)."""
    python = [f for f in frames if not f.native]
    return bool(python) and any(python[0].file.replace("\\", "/").endswith(p) for p in _WAITS_ON_THREADS)


def thread_busy(frames: list[Frame]) -> bool:
    """True when a thread is in the job's own code (reading, computing), not idle in a queue or a lock
    of the standard library, nor a thread of torch's own (the pin-memory thread) with no user frame."""
    python = [f for f in frames if not f.native]
    if not python or not any(is_user_frame(f) for f in python):
        return False
    return not any(python[0].file.replace("\\", "/").endswith(p) for p in _WAITS_ON_THREADS)


def worker_busy(frames: list[Frame]) -> bool:
    """True when a worker is on data (fetching a batch: in the dataset's code), not waiting for work.

    Fetching shows torch's fetcher among the worker's own frames; without it, a worker anywhere in
    its index queue's ``get`` is idle, however deep the wait goes (``selectors``, ``select``)."""
    own = [f.file.replace("\\", "/") for f in _own(frames)]
    if not own:
        return False
    if any(f.endswith(_FETCH) for f in own):
        return True
    return not any(p in f for f in own for p in _WORKER_IDLE)


def _file_words(wait: KernelWait) -> str:
    """``/data/shard2, a FIFO (named pipe)`` / ``a socket`` / ``/mnt/d/x.bin on nfs4``."""
    kind = {"fifo": "a FIFO (named pipe)", "socket": "a socket", "pipe": "a pipe"}.get(wait.kind or "", "")
    on = (
        f" on {wait.fstype}"
        if wait.fstype and wait.fstype.startswith(("nfs", "fuse", "lustre", "cifs"))
        else ""
    )
    path = wait.path or ""
    return ", ".join(p for p in (path + on, kind) if p)


def kernel_phrase(wait: KernelWait) -> str:
    """``in the kernel at wait_for_partner (openat /data/shard2, a FIFO (named pipe) with no writer)``."""
    what = _file_words(wait)
    if wait.wchan == "wait_for_partner":
        what = f"{what} that no process has opened from the other end: the open blocks until one does"
    elif wait.kind in ("fifo", "pipe") and wait.syscall in ("read", "readv", "pread64"):
        what = f"{what}: no process writes to it"
    elif wait.wchan and "futex" in wait.wchan:
        what = "a lock or condition (futex) another thread or process holds"
    elif (wait.fstype and wait.fstype.startswith("nfs")) or (wait.wchan or "").startswith(("rpc_", "nfs")):
        what = f"{what}: a network file system that does not answer" if what else "a network file system"
    call = f"{wait.syscall} " if wait.syscall and what and wait.path else ""
    at = f"in the kernel at {wait.wchan}" if wait.wchan and wait.wchan != "0" else "in the kernel"
    return f"{at} ({call}{what})" if what else at


def unread_worker_line(rank: int, pid: int, why: str, wait: KernelWait) -> str | None:
    """``rank 2's DataLoader worker (pid 311) could not be read (in D state), in the kernel at
    rpc_wait_bit_killable (read /mnt/d/x.bin on nfs4: ...)``: a worker py-spy cannot read (one in
    uninterruptible sleep cannot be attached at all) still says where it sleeps, when it sleeps on
    something; None when it does not (its wait says nothing)."""
    if wait.wchan in (None, "0") and wait.path is None:
        return None
    return f"rank {rank}'s DataLoader worker (pid {pid}) could not be read ({why}), {kernel_phrase(wait)}"


def _own(frames: list[Frame]) -> list[Frame]:
    """A worker's own Python frames: those above its ``_worker_loop`` (a forked worker's stack goes
    on with its parent's frames, whose ``main`` is not where the worker waits)."""
    python = [f for f in frames if not f.native]
    loop = next((i for i, f in enumerate(python) if f.file.replace("\\", "/").endswith(_WORKER_LOOP)), None)
    return python[:loop] if loop else python


def worker_line(
    rank: int,
    pid: int,
    frames: list[Frame],
    wait: KernelWait,
    source: dict[tuple[str, int], str],
    who: str = "DataLoader worker",
) -> str:
    """``rank 2's DataLoader worker (pid 311) waits at data.py:29 in ShardDataset.__getitem__ (`open(...)`),
    in the kernel at wait_for_partner (...)``: the worker's own line and what it waits on. ``who``
    names a thread instead (``thread reader``; ``pid`` is then its thread id)."""
    python = _own(frames)
    where = next((f for f in python if is_user_frame(f)), python[0] if python else None)
    at = ""
    if where is not None:
        file = os.path.basename(where.file) if is_user_frame(where) else short_path(where.file)
        line = source.get((where.file, where.line or 0), "").strip()
        quoted = f" (`{line[:80]}`)" if line else ""
        at = f" at {file}:{where.line} in {where.function}{quoted}"
    ident = "tid" if who.startswith("thread") else "pid"
    return f"rank {rank}'s {who} ({ident} {pid}) waits{at}, {kernel_phrase(wait)}"


__all__ = [
    "MAX_WORKERS",
    "KernelWait",
    "kernel_phrase",
    "thread_busy",
    "unread_worker_line",
    "waits_on_children",
    "waits_on_threads",
    "worker_busy",
    "worker_line",
]
