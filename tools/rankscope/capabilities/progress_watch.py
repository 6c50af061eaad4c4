"""Watch a live job for a moment: py-spy's sampler on every rank between two dumps, CPU time and the
main thread's I/O counters at both ends, its kernel wait (state, wchan) read during the window.

The first dump is the capture itself (taken with locals, integers kept, when a window is
asked); then every rank is sampled without pausing it (``py-spy record --nonblocking``) while
the rest of the evidence is gathered; then every rank is dumped once more with locals. What
each rank did in between goes to :func:`rankscope.analysis.hang.progress.judge`. The window is
bounded (``DumpOptions.window``, at most :data:`rankscope.options.MAX_WINDOW_S`), every sampler is interrupted at its end and reaped
(killed if it does not stop), and one rank's failure leaves the others' looks intact.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rankscope.analysis.hang.counters import int_locals
from rankscope.analysis.hang.frames import NO_PTRACE_STATES
from rankscope.analysis.hang.progress import RankWatch, parse_record
from rankscope.analysis.hang.progress_signals import own_reprs
from rankscope.models.core import Frame, RankProcess, ThreadStack
from rankscope.runtime import procfs, pyspy

log = logging.getLogger("rankscope.capabilities.progress_watch")

SAMPLE_RATE = 50
"""Samples per second per rank while the job is watched."""

KERNEL_LOOKS = 40
"""Reads of each rank's kernel wait (state, wchan) over a window, at most: the cost stays bounded
however long the window."""

KERNEL_EVERY_S = 0.05
"""The shortest pause between two reads of the ranks' kernel waits."""


def main_frames(threads: list[ThreadStack] | None) -> list[Frame]:
    thread = next((t for t in threads or [] if t.is_main), None)
    return thread.frames if thread is not None else []


@dataclass
class Window:
    """A window of looks under way: when it started, each rank's CPU time then, its samplers."""

    exe: str
    procs: list[RankProcess] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    cpu: dict[int, float | None] = field(default_factory=dict)
    queued: dict[int, float | None] = field(default_factory=dict)
    samplers: dict[int, tuple[subprocess.Popen[bytes], str]] = field(default_factory=dict)
    folder: str = ""
    first: dict[int, tuple[list[Frame], dict[str, int]]] = field(default_factory=dict)
    io: dict[int, dict[str, int] | None] = field(default_factory=dict)
    kernel: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    reprs: dict[int, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def open(cls, pids: list[int], exe: str) -> Window:
        """Note the time and each rank's CPU time, run-queue time and I/O counters, just before the first
        dump."""
        return cls(
            exe=exe,
            cpu={pid: procfs.cpu_seconds(pid) for pid in pids},
            queued={pid: procfs.queued_seconds(pid) for pid in pids},
            io={pid: procfs.io_counters(pid) for pid in pids},
        )

    def first_look(self, pid: int, threads: list[ThreadStack] | None) -> None:
        """The capture's own dump of ``pid`` (locals not yet dropped): its main thread, counters, and
        its own frames' locals (in memory: whether they move, what a loop waits on)."""
        frames = main_frames(threads)
        self.first[pid] = (_strip(frames), int_locals(frames))
        self.reprs[pid] = own_reprs(frames)

    def _kernel_looks(self, until: float) -> None:
        """Until ``until`` (monotonic), read where each rank's main thread is in the kernel, at most
        :data:`KERNEL_LOOKS` times: a rank that sleeps in a file write is not one that sleeps in a timer."""
        pids = [p.pid for p in self.procs if p.pid in self.first]
        interval = max(KERNEL_EVERY_S, (until - time.monotonic()) / KERNEL_LOOKS)
        while True:
            for pid in pids:
                seen = procfs.kernel_wait(pid)
                if seen is not None:
                    self.kernel.setdefault(pid, []).append(seen)
            left = until - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(interval, left) if pids else left)

    def sample(self, procs: list[RankProcess], states: dict[int, str]) -> None:
        """Start a sampler on every rank of ``procs`` (as the capture numbered them: mp.spawn ranks
        get their number from it) that runs; a stopped rank is never attached."""
        self.procs = [p for p in procs if p.pid in self.cpu]
        folder = tempfile.mkdtemp(prefix="rankscope-window-")
        for p in self.procs:
            if states.get(p.pid) in NO_PTRACE_STATES or p.pid not in self.first:
                continue
            out = os.path.join(folder, f"{p.pid}.txt")
            try:
                self.samplers[p.pid] = (pyspy.start_record(p.pid, out, rate=SAMPLE_RATE, exe=self.exe), out)
            except pyspy.DumpFailed as exc:
                log.info("no sampler on pid %d: %s", p.pid, exc)
        self.folder = folder

    def stop(self) -> dict[int, list[tuple[list[Frame], int]]]:
        """Stop every sampler (interrupted, reaped, killed if need be) and read what each saw."""
        samples: dict[int, list[tuple[list[Frame], int]]] = {}
        for pid, (proc, out) in list(self.samplers.items()):
            text = pyspy.stop_record(proc, out)
            samples[pid] = parse_record(text, procfs.code_roots(pid)).get(pid, [])  # main thread: tid == pid
            del self.samplers[pid]
        if self.folder:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)
        return samples

    def close(
        self, until: float, last_look: Callable[[list[int]], dict[int, list[ThreadStack]]]
    ) -> tuple[list[RankWatch], dict[int, list[ThreadStack]]]:
        """Wait until ``until`` (monotonic), stop the samplers, take the last look; the watches and
        the last dumps (with locals, for the counters pass)."""
        self._kernel_looks(until)
        samples = self.stop()
        last = last_look(sorted(self.first))
        wall = time.monotonic() - self.started
        watches: list[RankWatch] = []
        for p in self.procs:
            if p.rank is None or p.pid not in self.first:
                continue
            watches.append(self._watch(p, samples.get(p.pid, []), last.get(p.pid), wall))
        return watches, last

    def _watch(
        self,
        proc: RankProcess,
        samples: list[tuple[list[Frame], int]],
        last: list[ThreadStack] | None,
        wall: float,
    ) -> RankWatch:
        frames, counters = self.first[proc.pid]
        watch = RankWatch(
            rank=proc.rank or 0,
            looks=[frames],
            counters=[counters],
            samples=samples,
            kernel=self.kernel.get(proc.pid, []),
            reprs=[self.reprs.get(proc.pid, {})],
        )
        if last is not None:
            end = main_frames(last)
            watch.looks.append(_strip(end))
            watch.counters.append(int_locals(end))
            watch.reprs.append(own_reprs(end))
        before, after = self.cpu.get(proc.pid), procfs.cpu_seconds(proc.pid)
        if before is not None and after is not None:
            watch.cpu_s = max(0.0, after - before)
        queued_before, queued_after = self.queued.get(proc.pid), procfs.queued_seconds(proc.pid)
        if queued_before is not None and queued_after is not None:
            watch.queued_s = max(0.0, queued_after - queued_before)
        io_before, io_after = self.io.get(proc.pid), procfs.io_counters(proc.pid)
        if io_before is not None and io_after is not None:
            watch.io = [io_before, io_after]
        watch.wall_s = wall
        return watch


def _strip(frames: list[Frame]) -> list[Frame]:
    """Frames without their locals: only the integers (read apart) are kept."""
    return [f.model_copy(update={"locals": None}) if f.locals else f for f in frames]


__all__ = ["Window", "main_frames"]
