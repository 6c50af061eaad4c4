"""Process trees from /proc, and reaping what rankscope started.

torchrun starts each worker in its own session, so killing torchrun's process
group does not reach the ranks. To leave no orphans, rankscope snapshots the
whole tree of the pid *it started* (by parent links, never by name), signals
each process group in it, waits a bounded time, then SIGKILLs what is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping

from rankscope.runtime import procfs

# Re-exported: callers that only need the parent link import it from here.
parent_of = procfs.parent_of
_alive = procfs.is_alive


def children_map() -> dict[int, list[int]]:
    """Map every pid to its direct children, from one pass over /proc."""
    kids: dict[int, list[int]] = {}
    for pid in procfs.pids():
        ppid = parent_of(pid)
        if ppid is not None:
            kids.setdefault(ppid, []).append(pid)
    return kids


class ParentLinks:
    """Every process's parent, kept between calls by a loop that asks again and again (a watch's
    samples, a launched job's idle checks). :func:`children_map` reads the stat file of every
    process on the host, a few ms per hundred processes: on a busy node, at every sample, that is
    most of what a sample costs. Here each call lists /proc and reads only the pids it has not seen,
    and those whose parent is gone (an orphan is re-parented); every ``full_every`` calls it reads
    them all again, so a pid reused in between is not kept under its old parent for long."""

    def __init__(self, full_every: int = 30) -> None:
        self.full_every = full_every
        self.calls = 0
        self.parent: dict[int, int] = {}

    def children(self) -> dict[int, list[int]]:
        """Map every pid to its direct children, as :func:`children_map` does."""
        if self.calls % self.full_every == 0:
            self.parent.clear()
        self.calls += 1
        now = set(procfs.pids())
        for gone in self.parent.keys() - now:
            del self.parent[gone]
        stale = [p for p, pp in self.parent.items() if pp not in self.parent]
        for pid in [*(now - self.parent.keys()), *stale]:
            ppid = parent_of(pid)
            if ppid is None:
                self.parent.pop(pid, None)
            else:
                self.parent[pid] = ppid
        kids: dict[int, list[int]] = {}
        for pid, ppid in self.parent.items():
            kids.setdefault(ppid, []).append(pid)
        return kids


def descendants(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    """All descendants of ``pid`` (breadth first), not including ``pid``."""
    kids = children_map() if kids is None else kids
    out: list[int] = []
    todo = list(kids.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _signal_tree(pids: list[int], sig: int) -> None:
    groups: set[int] = set()
    for p in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(p))
    own = os.getpgrp()
    for g in groups:
        if g != own:
            with contextlib.suppress(OSError):
                os.killpg(g, sig)
    for p in pids:
        with contextlib.suppress(OSError):
            os.kill(p, sig)


def kill_survivors(seen: Mapping[int, int]) -> list[int]:
    """SIGKILL each process of ``seen`` (pid -> start time in clock ticks, taken while it ran under
    a tree rankscope started) that still runs with that start time; the pids killed.

    What outlived :func:`reap_tree` (a rank its launcher let go of, re-parented to init) is no
    longer under the root, so it is found by the pid *and* start time recorded earlier: a pid
    the kernel reused since belongs to someone else and is left alone.
    """
    killed: list[int] = []
    for pid, start in seen.items():
        fields = procfs.stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        try:
            now = int(fields[19])
        except (IndexError, ValueError):
            continue
        if now == start:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def reap_tree(proc: subprocess.Popen[bytes] | subprocess.Popen[str] | int, grace: float = 5.0) -> list[int]:
    """Terminate a process we started and every descendant; return the pids signalled.

    SIGTERM first (torchrun forwards it and lets ranks clean up), SIGKILL after
    ``grace`` seconds for whatever is left. Bounded: never waits longer than
    ``grace`` + 2 s.
    """
    root = proc if isinstance(proc, int) else proc.pid
    tree = [root, *descendants(root)]
    live = [p for p in tree if _alive(p)]
    if live:
        _signal_tree(live, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            # re-scan: a launcher may have spawned more children meanwhile
            tree = list(dict.fromkeys([*tree, *descendants(root)]))
            live = [p for p in tree if _alive(p)]
            if not live:
                break
            if not isinstance(proc, int):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.05)
            else:
                time.sleep(0.05)
        if live:
            _signal_tree(live, signal.SIGKILL)
    if not isinstance(proc, int):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2.0)
    return tree
