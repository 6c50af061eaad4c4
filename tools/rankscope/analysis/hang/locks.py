"""Lock-order deadlocks: threads of one rank that each hold a lock another of them waits for.

Two threads that take two locks in opposite order stop for good only under one timing; no log
line and no file records it, and the other ranks time out in their next collective as if that
rank had merely gone elsewhere. Only the rank's threads at the stall say why: each is blocked at
a ``with b:`` (or ``b.acquire()``) line inside a ``with a:`` still open above it. This module
reads that from the threads' Python frames and the source lines the capture read around them
(the shell reads the files; here only the text it is given is read), and closes the cycle by the
locks' names as the code spells them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rankscope.analysis.hang.conditions import indent
from rankscope.analysis.hang.frames import is_internal_frame, is_user_frame, short_path
from rankscope.models.core import Confidence, Frame, RankStack, ThreadStack

LOCK_LOOK_BACK = 40
"""Source lines read above a blocked thread's line for the ``with``/``acquire()`` still open there."""

HOLD_FRAMES = 3
"""The blocked thread's own frames searched for locks it holds, innermost first: a helper that takes
``b`` is often called from inside the caller's ``with a:``."""

LOCK_ORDER = "lock-order deadlock"
"""What the verdict calls it; a note added to the verdict later tells the verdict by it."""

MAX_CYCLE = 8
"""The longest cycle looked for, in threads."""

_WITH = re.compile(r"^(?:async\s+)?with\s+(?P<items>.+?):\s*(?:#.*)?$")
_ACQUIRE = re.compile(r"(?P<name>[A-Za-z_][\w.]*(?:\[[^\]]*\])?)\.acquire\(")
_RELEASE = re.compile(r"(?P<name>[A-Za-z_][\w.]*(?:\[[^\]]*\])?)\.release\(")
CYCLE_LINE = re.compile(r"^rank \d+ thread .+ holds `")
"""An evidence line of a lock cycle (:meth:`LockCycle.evidence`)."""
_NAME = re.compile(r"^[A-Za-z_][\w.]*(?:\[[^\]]*\]|\([^(),]*\))?$")
"""A lock as the code spells it: ``a``, ``self._lock``, ``locks[i]``, ``lock_for(key)`` (the last two
may name another lock at another line, so a cycle closed through them is less sure)."""
_NATIVE_WAITS = (
    "acquire_lock",
    "acquire_timed",
    "rlock_acquire",
    "futex",
    "sem_wait",
    "sem_timedwait",
    "sem_clockwait",
)
"""Native frames of a thread blocked taking a lock (CPython's ``lock_PyThread_acquire_lock``,
``PyThread_acquire_lock_timed``, glibc's futex and semaphore waits)."""
_TAKING = frozenset({"__enter__", "acquire"})
"""Standard-library frames (threading's Condition/RLock wrappers) that are still taking a lock; any
other (``join``, ``Condition.wait``, ``Event.wait``) waits for something else and holds nothing."""


def lock_names(text: str) -> list[str]:
    """The locks a source line takes: each item of ``with a, self._lock as l:`` that is a name, an
    element or a call of at most one argument (``open(p, "rb")`` is no lock; ``torch.no_grad()`` is
    counted, and never closes a cycle, since no thread waits to take it), or ``x`` of ``x.acquire()``."""
    stripped = text.strip()
    m = _WITH.match(stripped)
    if m is not None:
        items = m.group("items").strip()
        if items.startswith("(") and items.endswith(")"):  # with (a, b):
            items = items[1:-1]
        names = [item.split(" as ", 1)[0].strip() for item in items.split(",")]
        return [name for name in names if _NAME.match(name)]
    return [m.group("name") for m in _ACQUIRE.finditer(stripped)]


def blocked_site(thread: ThreadStack) -> Frame | None:
    """The job's frame where ``thread`` waits to take a lock, when its frames say it may: the innermost
    frame that is not the standard library's or torch's (those above it only take the lock), and, when
    native frames were read, one of them a lock or futex wait."""
    native = [f for f in thread.frames if f.native]
    if native and not any(w in f.function for f in native for w in _NATIVE_WAITS):
        return None
    for frame in (f for f in thread.frames if not f.native):
        if frame.line is None:
            return None
        if not is_internal_frame(frame):
            return frame
        if frame.function not in _TAKING:
            return None
    return None


def lock_frames(thread: ThreadStack) -> list[Frame]:
    """The frames whose lines the rule reads for ``thread``: where it waits, and its own frames out
    from there (the capture reads :data:`LOCK_LOOK_BACK` lines above each)."""
    site = blocked_site(thread)
    if site is None:
        return []
    python = [f for f in thread.frames if not f.native and f.line is not None]
    start = python.index(site)
    return [f for f in python[start:] if not is_internal_frame(f)][:HOLD_FRAMES]


def held_at(frame: Frame, source: Mapping[tuple[str, int], str]) -> list[tuple[str, int]]:
    """The locks still taken around ``frame``'s line, with the line that took each: the enclosing
    ``with`` blocks of its function, and ``x.acquire()`` lines at its level or above with no
    ``x.release()`` between."""
    if frame.line is None or (here := source.get((frame.file, frame.line))) is None:
        return []
    level = indent(here)
    released: set[str] = set()
    held: list[tuple[str, int]] = []
    for n in range(frame.line - 1, max(0, frame.line - LOCK_LOOK_BACK) - 1, -1):
        text = source.get((frame.file, n))
        if text is None or not text.strip() or text.lstrip().startswith("#"):
            continue
        if indent(text) > level:
            continue
        stripped = text.strip()
        released.update(m.group("name") for m in _RELEASE.finditer(stripped))
        if indent(text) < level:
            level = indent(text)
            if stripped.startswith(("def ", "async def ", "class ")):
                break
            if _WITH.match(stripped):
                held += [(name, n) for name in lock_names(stripped)]
                continue
        held += [(m.group("name"), n) for m in _ACQUIRE.finditer(stripped) if m.group("name") not in released]
    return held


@dataclass(frozen=True)
class LockWait:
    """One thread blocked taking a lock while it holds others."""

    thread: str
    frame: Frame
    waits: tuple[str, ...]
    holds: tuple[tuple[str, Frame, int], ...]
    """Each lock held: its name, the frame that took it, the line that took it."""

    def where(self) -> str:
        return f"{_file(self.frame)}:{self.frame.line}"

    def held_where(self, name: str) -> str:
        for held, frame, line in self.holds:
            if held == name:
                return f"{_file(frame)}:{line}"
        return "?"


def _file(frame: Frame) -> str:
    """The job's own file by its name, as the verdict names the ranks' lines; a library's from its package."""
    return os.path.basename(frame.file) if is_user_frame(frame) else short_path(frame.file)


def lock_wait(thread: ThreadStack, source: Mapping[tuple[str, int], str]) -> LockWait | None:
    """``thread`` as a :class:`LockWait`, when it is blocked at a lock-taking line and holds a lock."""
    frames = lock_frames(thread)
    if not frames or frames[0].line is None:
        return None
    waits = lock_names(source.get((frames[0].file, frames[0].line), ""))
    if not waits:
        return None
    holds = tuple((name, f, n) for f in frames for name, n in held_at(f, source) if name not in waits)
    if not holds:
        return None
    name = thread.name or f"thread {thread.os_thread_id or thread.thread_id}"
    return LockWait(name, frames[0], tuple(waits), holds)


@dataclass(frozen=True)
class LockCycle:
    """Threads of one rank each waiting for a lock the next one holds, the last for the first's."""

    rank: int | None
    threads: tuple[LockWait, ...]
    locks: tuple[str, ...]
    """``locks[i]``: the lock ``threads[i]`` holds and ``threads[i - 1]`` waits for."""
    confidence: Confidence

    def summary(self) -> str:
        names = " and ".join(t.thread for t in self.threads)
        order = " -> ".join(f"`{name}`" for name in (*self.locks, self.locks[0]))
        return (
            f"rank {self.rank} is in a {LOCK_ORDER} (lock cycle {order}): threads {names} each hold "
            "one lock and wait for the next one's; take the locks in one order everywhere, or use one lock"
        )

    def evidence(self) -> list[str]:
        n = len(self.threads)
        return [
            f"rank {self.rank} thread {t.thread} holds `{self.locks[i]}` (taken at {t.held_where(self.locks[i])}) "
            f"and waits for `{self.locks[(i + 1) % n]}` at {t.where()}"
            for i, t in enumerate(self.threads)
        ]


def _cycle(waits: Sequence[LockWait]) -> list[int] | None:
    """Indices of waits forming a cycle (each waits for a lock the next holds), the shortest one."""
    holds = [{h for h, _, _ in w.holds} for w in waits]
    after = {
        i: [j for j in range(len(waits)) if j != i and set(w.waits) & holds[j]] for i, w in enumerate(waits)
    }
    found: list[list[int]] = []
    for start in range(len(waits)):
        paths = [[start]]
        while paths:  # breadth first: the first path back to ``start`` is its shortest cycle
            path = paths.pop(0)
            if start in after[path[-1]]:
                found.append(path)
                break
            paths += [[*path, j] for j in after[path[-1]] if j not in path and len(path) < MAX_CYCLE]
    return min(found, key=len, default=None)


def _held_of(waits: Sequence[LockWait], cycle: list[int], k: int) -> str:
    """The lock the ``k``-th thread of ``cycle`` holds and the one before it waits for."""
    before = waits[cycle[k - 1]]
    return next(h for h, _, _ in waits[cycle[k]].holds if h in before.waits)


def lock_cycle(stack: RankStack, source: Mapping[tuple[str, int], str]) -> LockCycle | None:
    """The lock cycle among ``stack``'s threads, if their frames and lines close one."""
    waits = [w for t in stack.threads if (w := lock_wait(t, source)) is not None]
    found = _cycle(waits) if len(waits) > 1 else None
    if found is None:
        return None
    first = min(range(len(found)), key=lambda k: _held_of(waits, found, k))
    threads = tuple(waits[i] for i in [*found[first:], *found[:first]])  # from the first lock by name
    n = len(threads)
    locks = tuple(
        next(h for h, _, _ in t.holds if h in threads[(i - 1) % n].waits) for i, t in enumerate(threads)
    )
    sure = not any(c in name for name in locks for c in "[(")
    return LockCycle(stack.rank, threads, locks, "high" if sure else "medium")


def lock_cycles(stacks: Iterable[RankStack], source: Mapping[tuple[str, int], str]) -> list[LockCycle]:
    """Every rank's lock cycle, where one closes."""
    return [c for s in stacks if (c := lock_cycle(s, source)) is not None]


__all__ = [
    "CYCLE_LINE",
    "HOLD_FRAMES",
    "LOCK_LOOK_BACK",
    "LOCK_ORDER",
    "MAX_CYCLE",
    "LockCycle",
    "LockWait",
    "blocked_site",
    "held_at",
    "lock_cycle",
    "lock_cycles",
    "lock_frames",
    "lock_names",
    "lock_wait",
]
