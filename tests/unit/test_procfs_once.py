"""``procfs.reading_once``: inside the scope a live process's stable facts (open files, environ,
cmdline, exe, cwd, start time, thread names, maps) are read once per pid, whoever asks; the facts
of a moment (stat's state and CPU time, io, wchan, status) are read every time, so a process that
exits mid-capture reads as gone; nested scopes share the outer one; outside a scope nothing is kept.

Reads are counted through procfs's three raw accesses (``_read_bytes``, ``_listdir``, ``_readlink``),
which every read of /proc/PID goes through."""

from __future__ import annotations

import contextvars
import os
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rankscope.runtime import procfs


@pytest.fixture
def child() -> Iterator[int]:
    """A live process of our own (Popen returns once it runs python), killed and reaped after."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.DEVNULL)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=30)


def count_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[int, str]]:
    """(pid, what under /proc/PID) -> how many times it was read, listed or followed, from now on."""
    counts: Counter[tuple[int, str]] = Counter()

    def counted(real: Callable[[Path], object]) -> Callable[[Path], object]:
        def wrapper(p: Path) -> object:
            rel = Path(p).relative_to(procfs.PROC)
            if rel.parts[0].isdigit():
                counts[(int(rel.parts[0]), "/".join(rel.parts[1:]))] += 1
            return real(p)

        return wrapper

    for name in ("_read_bytes", "_listdir", "_readlink"):
        monkeypatch.setattr(procfs, name, counted(getattr(procfs, name)))
    return counts


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[int, str]]:
    return count_reads(monkeypatch)


def read_stable(pid: int) -> None:
    """Every reader of a stable fact, as the capture's modules call them."""
    procfs.environ(pid)
    procfs.read_environ(pid)
    procfs.cmdline(pid)
    procfs.read_cmdline(pid)
    procfs.read_exe(pid)
    procfs.read_cwd(pid)
    procfs.fd_targets(pid)
    procfs.device_fds(pid, "/dev/nvidia")
    procfs.open_files(pid, "rankscope-")
    procfs.socket_inodes(pid)
    procfs.thread_names(pid)
    procfs.mapped_paths(pid)
    procfs.maps_mention(pid, (b"libpython",))
    procfs.read_text(pid, "maps")
    procfs.process_signs(pid)
    procfs.start_epoch(pid)


STABLE = ("environ", "cmdline", "exe", "cwd", "fd", "task", "maps")


def test_the_scope_reads_each_stable_fact_once(child: int, reads: Counter[tuple[int, str]]) -> None:
    with procfs.reading_once():
        read_stable(child)
        first = dict(reads)
        read_stable(child)
    assert reads == first  # the second round read nothing
    for what in STABLE:
        assert reads[(child, what)] == 1, what
    assert reads[(child, "stat")] == 1  # the start time, once
    comms = [k for k in reads if k[0] == child and k[1].endswith("/comm")]
    assert comms and all(reads[k] == 1 for k in comms)


def test_the_scope_never_keeps_a_moment(child: int, reads: Counter[tuple[int, str]]) -> None:
    moments: list[Callable[[int], object]] = [
        procfs.stat_fields,
        procfs.read_stat,
        procfs.cpu_seconds,
        procfs.proc_state,
        procfs.is_alive,
        procfs.parent_of,
        procfs.io_counters,
        procfs.kernel_wait,
        procfs.caught_signals,
    ]
    with procfs.reading_once():
        for _ in range(2):
            for read in moments:
                read(child)
    assert reads[(child, "stat")] == 2 * 6
    assert reads[(child, f"task/{child}/io")] == 2 and reads[(child, "io")] == 2
    assert reads[(child, f"task/{child}/stat")] == 2 and reads[(child, f"task/{child}/wchan")] == 2
    assert reads[(child, "status")] == 2


def test_a_process_that_exits_inside_the_scope_reads_as_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.DEVNULL)
    try:
        with procfs.reading_once():
            env = procfs.read_environ(proc.pid)
            started = procfs.start_epoch(proc.pid)
            assert env is not None and started is not None and procfs.is_alive(proc.pid)
            proc.kill()
            proc.wait(timeout=30)
            assert not procfs.is_alive(proc.pid) and procfs.proc_state(proc.pid) is None
            assert procfs.read_stat(proc.pid) is None and procfs.cpu_seconds(proc.pid) is None
            # what it was stays what it was for the rest of the capture
            assert procfs.read_environ(proc.pid) == env and procfs.start_epoch(proc.pid) == started
        assert procfs.read_environ(proc.pid) is None and procfs.start_epoch(proc.pid) is None
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_nested_scope_shares_the_outer_one(child: int, reads: Counter[tuple[int, str]]) -> None:
    with procfs.reading_once():
        procfs.read_environ(child)
        with procfs.reading_once():
            procfs.read_environ(child)
            procfs.fd_targets(child)
        procfs.read_environ(child)  # the inner scope's end drops nothing
        procfs.fd_targets(child)
    assert reads[(child, "environ")] == 1 and reads[(child, "fd")] == 1


def test_outside_a_scope_every_call_reads(child: int, reads: Counter[tuple[int, str]]) -> None:
    for _ in range(2):
        procfs.read_environ(child)
        procfs.fd_targets(child)
        procfs.thread_names(child)
        procfs.read_exe(child)
        procfs.mapped_paths(child)
        procfs.start_epoch(child)
    with procfs.reading_once():
        procfs.read_environ(child)
    procfs.read_environ(child)  # a closed scope keeps nothing
    assert reads[(child, "environ")] == 4
    assert reads[(child, "fd")] == reads[(child, "task")] == reads[(child, "exe")] == 2
    assert reads[(child, "maps")] == reads[(child, "stat")] == 2


def test_a_scope_is_its_own_contexts(child: int, reads: Counter[tuple[int, str]]) -> None:
    """Another context (an MCP call in another worker thread) never answers from this capture's facts."""
    with procfs.reading_once():
        procfs.read_environ(child)
        contextvars.Context().run(procfs.read_environ, child)
    assert reads[(child, "environ")] == 2


def test_a_refusal_is_kept_and_raised_again(reads: Counter[tuple[int, str]]) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.DEVNULL)
    proc.wait(timeout=60)  # reaped: its pid names no process
    with procfs.reading_once():
        for _ in range(2):
            with pytest.raises(FileNotFoundError):
                procfs.environ(proc.pid)
            assert procfs.read_cmdline(proc.pid) == [] and procfs.read_exe(proc.pid) is None
    assert reads[(proc.pid, "environ")] == 1 and reads[(proc.pid, "cmdline")] == 1


def test_the_filters_share_one_walk_over_the_open_files(reads: Counter[tuple[int, str]]) -> None:
    me = os.getpid()
    with (
        tempfile.NamedTemporaryFile(prefix="rankscope-marker-") as marker,
        socket.socket() as sock,
        procfs.reading_once(),
    ):
        marked = procfs.open_files(me, "rankscope-marker-")
        assert [target for _, target in marked] == [os.path.realpath(marker.name)]
        assert all(link.startswith(f"{procfs.PROC}/{me}/fd/") for link, _ in marked)
        assert os.fstat(sock.fileno()).st_ino in procfs.socket_inodes(me)
        assert "/dev/null" not in procfs.device_fds(me, "/dev/nvidia")
        targets = [t for _, t in procfs.fd_targets(me)]
        assert procfs.device_fds(me) == tuple(t for t in targets if t.startswith("/dev/"))
    assert reads[(me, "fd")] == 1


def test_the_walk_reads_at_most_max_fds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procfs, "MAX_FDS", 2)
    assert len(procfs.fd_targets(os.getpid())) <= 2
