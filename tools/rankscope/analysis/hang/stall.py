"""Is a running job stalled? The one stall detector of `rankscope run` and `rankscope watch`.

Both watch a job over time with cheap samples only (/proc: CPU time, state, kernel wait, I/O; the
size of the files the ranks write their output to), and ask here whether the job still moves.
Progress is a signal that the job gets somewhere, never CPU alone: under NCCL a hung rank busy-polls
at a full core, so a job whose ranks burn CPU with nothing else moving is a stall candidate too, only
after a longer quiet (``busy_stall_s``). What counts as progress between two samples:

- output: a rank's (or the launcher's) output file grew, or the caller counted new lines;
- I/O: a rank's main thread moved enough bytes through large calls, or reached storage
  (:func:`rankscope.analysis.hang.progress_signals.io_bytes`), or waited on a file in the kernel
  (a checkpoint written to a slow file system is progress, however idle it looks);
- the set of ranks changed (a rank started or ended: a restart, the job's end).

Pure: the shell hands in the samples, this says what they show.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rankscope.analysis.hang.progress_signals import IO_MIN_BYTES, io_bytes, io_moved, kernel_kind

IDLE_CPU_FRACTION = 0.05
"""A rank is idle when its CPU time grew by less than this share of one core over the window."""

IDLE_RUNNABLE_FRACTION = 0.2
"""...and it was seen running or runnable (state R/D) in at most this share of the samples: on a
loaded host a starved rank gets little CPU, yet it is not idle."""

BUSY_FACTOR = 3.0
"""A job whose ranks burn CPU with nothing else moving is a stall candidate after this many times
the idle threshold (NCCL busy-polls in a hung collective, but a long computation looks the same)."""


@dataclass(frozen=True)
class RankSample:
    """One cheap reading of one rank (or any process of the job)."""

    pid: int
    cpu_s: float
    state: str = "S"
    wchan: str = ""
    io: Mapping[str, int] | None = None


@dataclass(frozen=True)
class JobSample:
    """Every process of the job read at one moment (``t``: monotonic seconds), and the output so far
    (bytes of its output files, or lines the caller read: any count that grows with output)."""

    t: float
    ranks: Mapping[int, RankSample] = field(default_factory=dict)
    output: int = 0


StallState = Literal["moving", "quiet", "suspect", "gone", "unknown"]
"""``moving``: progress within the threshold. ``quiet``: no progress yet, not long enough to suspect.
``suspect``: a stall candidate (confirm with a second sample before pausing anything). ``gone``: no
process left. ``unknown``: not watched long enough to say."""


@dataclass(frozen=True)
class StallCall:
    """What the samples say now, and why."""

    state: StallState
    quiet_s: float
    why: str
    idle: bool = False
    busy_pids: tuple[int, ...] = ()
    detail: str = ""
    """What the CPU check saw (the busiest process's share of a core, how often it was runnable)."""


def moved(before: JobSample, after: JobSample) -> list[str]:
    """The progress signals between two consecutive samples (empty: nothing moved)."""
    signs: list[str] = []
    if after.output > before.output:
        signs.append(f"output grew by {after.output - before.output}")
    if set(after.ranks) != set(before.ranks):
        signs.append("the set of processes changed")
    for pid, now in after.ranks.items():
        was = before.ranks.get(pid)
        if was is None:
            continue
        if was.io is not None and now.io is not None:
            read, written = io_bytes(io_moved([was.io, now.io]))
            if read + written >= IO_MIN_BYTES:
                signs.append(f"pid {pid} moved {read + written} bytes of I/O")
                continue
        if kernel_kind(now.state, now.wchan) == "file" and kernel_kind(was.state, was.wchan) == "file":
            signs.append(f"pid {pid} waits on a file (I/O under way)")
    return signs


def every_rank_ran(samples: Sequence[JobSample], pids: Sequence[int], since: float) -> bool:
    """Whether each of ``pids`` used CPU between the first sample at or after ``since`` and the last:
    a job that moves again moves on every rank, while one ending by its collective timeout prints from
    the ranks that waited (under load for seconds) and never from the one stuck in its read or lock."""
    first = next((s for s in samples if s.t >= since), None)
    if first is None:
        return False
    last = samples[-1]
    return all(
        pid in first.ranks and pid in last.ranks and last.ranks[pid].cpu_s > first.ranks[pid].cpu_s
        for pid in pids
    )


def last_progress(samples: Sequence[JobSample]) -> float | None:
    """The time of the latest sample that showed progress over the one before (None: none did)."""
    for before, after in zip(reversed(samples[:-1]), reversed(samples[1:]), strict=True):
        if moved(before, after):
            return after.t
    return None


def idle_over(samples: Sequence[JobSample], since: float) -> tuple[bool, list[int], str]:
    """Whether every process stayed idle from ``since`` to the last sample: (idle, busy pids, why)."""
    window = [s for s in samples if s.t > since]
    start = next((s for s in reversed(samples) if s.t <= since), None)
    if start is None or not window:
        return False, [], "not watched long enough"
    end = samples[-1]
    span = max(end.t - start.t, 1e-6)
    busy: list[int] = []
    busiest = 0.0
    runnable = 0.0
    for pid, now in end.ranks.items():
        was = start.ranks.get(pid)
        if was is None:
            return False, [pid], f"process {pid} started within the window"
        share = max(0.0, now.cpu_s - was.cpu_s) / span
        active = sum(1 for s in window if pid in s.ranks and s.ranks[pid].state in ("R", "D")) / len(window)
        busiest, runnable = max(busiest, share), max(runnable, active)
        if share >= IDLE_CPU_FRACTION or active > IDLE_RUNNABLE_FRACTION:
            busy.append(pid)
    why = (
        f"busiest process used {busiest:.0%} of a core over {span:.0f}s "
        f"and was runnable in {runnable:.0%} of the samples"
    )
    return not busy, busy, why


@dataclass
class StallDetector:
    """Samples fed one at a time (oldest first), the time of the last progress kept as they come,
    and only the samples the idle check needs kept: cheap however long the job runs quiet.

    ``stall_s``: quiet seconds, every process idle, that make a stall candidate; ``busy_stall_s``
    (default :data:`BUSY_FACTOR` × ``stall_s``): the same whatever the CPU; ``started``: when
    watching began (quiet counts from there at most)."""

    stall_s: float
    busy_stall_s: float | None = None
    started: float | None = None
    samples: deque[JobSample] = field(default_factory=deque)
    last_progress: float | None = None

    def add(self, sample: JobSample) -> None:
        if self.samples and moved(self.samples[-1], sample):
            self.last_progress = sample.t
        if self.started is None:
            self.started = sample.t
        self.samples.append(sample)
        while len(self.samples) > 2 and self.samples[1].t <= sample.t - self.stall_s:
            self.samples.popleft()  # keep exactly one sample older than the idle window

    def judge(self) -> StallCall:
        """The job's state now, and why."""
        if not self.samples:
            return StallCall("unknown", 0.0, "no sample yet")
        now = self.samples[-1]
        if not now.ranks:
            return StallCall("gone", 0.0, "no process of the job left")
        busy_stall_s = BUSY_FACTOR * self.stall_s if self.busy_stall_s is None else self.busy_stall_s
        origin = next(t for t in (self.last_progress, self.started, now.t) if t is not None)
        quiet = now.t - origin
        if quiet < self.stall_s:
            state: StallState = "moving" if self.last_progress is not None else "quiet"
            return StallCall(state, quiet, f"quiet for {quiet:.0f}s")
        idle, busy, why = idle_over(list(self.samples), now.t - self.stall_s)
        silent = f"no output, no I/O for {quiet:.0f}s"
        if idle:
            return StallCall("suspect", quiet, f"{silent}; {why}", idle=True, detail=why)
        if quiet >= busy_stall_s:
            spin = (
                f"; pid(s) {', '.join(map(str, busy[:8]))} busy (under NCCL a hung rank spins)"
                if busy
                else ""
            )
            return StallCall("suspect", quiet, f"{silent}; {why}{spin}", busy_pids=tuple(busy), detail=why)
        return StallCall("quiet", quiet, f"{silent}, but {why}", busy_pids=tuple(busy), detail=why)


def judge_stall(
    samples: Sequence[JobSample],
    stall_s: float,
    busy_stall_s: float | None = None,
    started: float | None = None,
) -> StallCall:
    """:class:`StallDetector`'s call on ``samples`` (oldest first), fed all at once."""
    detector = StallDetector(stall_s, busy_stall_s, started)
    for sample in samples:
        detector.add(sample)
    return detector.judge()


__all__ = [
    "BUSY_FACTOR",
    "IDLE_CPU_FRACTION",
    "IDLE_RUNNABLE_FRACTION",
    "JobSample",
    "RankSample",
    "StallCall",
    "StallDetector",
    "every_rank_ran",
    "idle_over",
    "judge_stall",
    "last_progress",
    "moved",
]
