"""Hung, slow or fine: whether a live job moves, read from several looks at each rank.

One instant of a moving job looks like a hang: its ranks stand in collectives, one rank is a
step ahead of another, on NCCL every CPU waits for the GPU. So before anyone is named, each
rank is looked at several times over a short window (py-spy dumps at both ends, py-spy's
sampler in between, CPU time from /proc at both ends), and this module decides from those
looks alone:

- a rank **moved** when a loop counter of its own code (step, epoch, i) changed, or the line
  of its own code it stands at did (the innermost frame outside torch and the standard
  library: training loops in third-party trainers count as its own); and, for a rank that does
  not wait most of the window, when its I/O moved (bytes read or written, or a file wait in the
  kernel: a checkpoint written to a slow disk at low CPU) or the locals of its own frames did
  (``progress_signals``);
- a rank is **busy** when it stands at one place of its own code but burns CPU there (a long
  evaluation, a checkpoint write, a compile), and **blocked** when it stands still without CPU
  of its own, or waits in a collective or for the GPU. On NCCL a CPU that waits for the GPU
  spins, so CPU time never counts as motion for a rank that waits;
- the job **moves** when every rank moved. Then no hang rule runs: the verdict is
  ``progressing``, or ``straggler`` when one rank is rarely waiting while the others mostly
  wait (for it). When some rank is blocked while the ranks that do not wait are busy in their
  own code, the verdict is ``busy``: slow or stuck cannot be told from this window. A window
  long enough (``progress_verdict.STUCK_WINDOW_S``) tells: a rank that stood in one loop of its
  own code with nothing but its lines moving is stuck there (``progress_stuck``: the loop, its
  condition and the values it reads).

Pure: the shell hands the looks in; nothing here reads /proc or the clock.
"""

from __future__ import annotations

import os
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rankscope.analysis.code_origin import origin_of
from rankscope.analysis.hang.counters import KNOWN_COUNTERS
from rankscope.analysis.hang.frames import is_internal_frame
from rankscope.analysis.hang.loops import LOOP_LOOK_BACK
from rankscope.analysis.hang.progress_signals import (
    io_moved,
    io_progress,
    kernel_shares,
    locals_moved,
    queued_words,
)
from rankscope.analysis.hang.progress_stuck import lines_around, stuck_loop
from rankscope.analysis.hang.progress_verdict import BUSY_CPU_PCT
from rankscope.analysis.hang.stacks import recognise_op
from rankscope.analysis.hang.waits import GPU_LIKE, classify_wait
from rankscope.analysis.ranges import ranks_phrase, value_span
from rankscope.models.core import Backend, CodeRoots, Frame
from rankscope.models.flight import FlightReport
from rankscope.models.progress import JobMotion, Motion, Progress, RankMotion

STRAGGLER_GAP_PCT = 30
"""How much less (in percentage points of samples) a straggler waits than every other rank."""

STRAGGLER_OTHERS_WAIT_PCT = 50
"""The median share of waiting of the other ranks above which they are said to wait for it."""

MAX_HOT = 3
"""Lines of its own code listed per rank."""


@dataclass
class RankWatch:
    """Everything the shell saw of one rank during the window.

    ``looks``: the main thread's frames at each dump (innermost first), in order;
    ``counters``: the progress counters read at the first and the last dump that had locals;
    ``later``: integer locals of looks taken after the window (at a straggler, for the sizes in
    the functions its time goes to): they say nothing about motion;
    ``samples``: the main thread's stacks py-spy's sampler saw, with how often;
    ``cpu_s``/``wall_s``: CPU time it used and wall time between its first and last look;
    ``queued_s``: time its main thread was runnable but waiting for a core, over the same span;
    ``io``: its main thread's I/O counters at both ends; ``kernel``: its main thread's state and
    wchan, read several times during the window; ``reprs``: the locals of its own frames at the first
    and the last look (``file:function:name`` -> repr, kept in memory: see ``progress_signals``).
    """

    rank: int
    looks: list[list[Frame]] = field(default_factory=list)
    counters: list[dict[str, int]] = field(default_factory=list)
    later: list[dict[str, int]] = field(default_factory=list)
    samples: list[tuple[list[Frame], int]] = field(default_factory=list)
    cpu_s: float | None = None
    queued_s: float | None = None
    wall_s: float = 0.0
    io: list[dict[str, int]] = field(default_factory=list)
    kernel: list[tuple[str, str]] = field(default_factory=list)
    reprs: list[dict[str, str]] = field(default_factory=list)


_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.+?)(?::(?P<line>\d+))?\)$")
_THREAD = re.compile(r"^thread \((?P<tid>0x[0-9A-Fa-f]+|\d+)\)")


def parse_record(text: str, roots: CodeRoots | None = None) -> dict[int, list[tuple[list[Frame], int]]]:
    """py-spy ``record --format raw --threads`` output -> os thread id -> [(frames innermost first, count)].

    Each line is ``thread (TID): NAME;outer (file:line);...;inner (file:line) COUNT``, outermost
    first. Lines that do not parse are skipped: a sampler's garbled line never fails a capture.
    ``roots``: the rank's (:class:`CodeRoots`), which tell each frame's origin.
    """
    out: dict[int, list[tuple[list[Frame], int]]] = {}
    for line in text.splitlines():
        head, _, count = line.rstrip().rpartition(" ")
        if not head or not count.isdigit():
            continue
        parts = head.split(";")
        m = _THREAD.match(parts[0])
        if m is None:
            continue
        tid = int(m["tid"], 16) if m["tid"].startswith("0x") else int(m["tid"])
        frames: list[Frame] = []
        for part in reversed(parts[1:]):
            fm = _FRAME.match(part)
            if fm is None:
                continue
            file = fm["file"]
            lineno = int(fm["line"]) if fm["line"] else None
            frames.append(Frame(function=fm["func"], file=file, line=lineno, origin=origin_of(file, roots)))
        out.setdefault(tid, []).append((frames, int(count)))
    return out


def own_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the job's own code (or a third-party training loop): where the rank is."""
    return next((f for f in frames if not f.native and f.file and not is_internal_frame(f)), None)


def _place(frames: Sequence[Frame]) -> tuple[str, int | None] | None:
    own = own_frame(frames)
    return (own.file, own.line) if own is not None else None


def _waiting(frames: list[Frame], backend: Backend | None, source: Mapping[tuple[str, int], str]) -> bool:
    """Whether one sampled stack waits: in a collective, or for the GPU (as the hang analysis reads it)."""
    python = [f for f in frames if not f.native]
    op, _ = recognise_op(python)
    if op is not None:
        return True
    own = own_frame(python)
    line = source.get((own.file, own.line)) if own is not None and own.line is not None else None
    kind, _ = classify_wait(python, None, backend=backend, has_native=False, user_line=line)
    return kind in GPU_LIKE


def _moved_counters(counters: list[dict[str, int]]) -> dict[str, list[int]]:
    if len(counters) < 2:
        return {}
    first, last = counters[0], counters[-1]
    return {k: [first[k], last[k]] for k in first if k in last and first[k] != last[k]}


def _samples(w: RankWatch) -> list[tuple[list[Frame], int]]:
    """The sampler's stacks, else the dumps themselves (one sample each)."""
    return w.samples or [(frames, 1) for frames in w.looks]


_Place = tuple[str, str, int | None]
"""(function, file, line) of a rank's own frame."""


def _own_counts(weighted: list[tuple[list[Frame], int, bool]]) -> Counter[_Place]:
    own: Counter[_Place] = Counter()
    for frames, n, waiting in weighted:
        frame = own_frame(frames)
        if not waiting and frame is not None:
            own[(frame.function, frame.file, frame.line)] += n
    return own


def _hot(own: Counter[_Place], total: int) -> list[str]:
    return [
        f"{function} ({os.path.basename(file)}:{line}) {100 * n // max(total, 1)}%"
        for (function, file, line), n in own.most_common(MAX_HOT)
    ]


MAX_CODE = 120
"""Characters of the top hot line's source text quoted at most."""


def _top_code(own: Counter[_Place], source: Mapping[tuple[str, int], str]) -> str | None:
    """The source text of the line a rank spends most of its own time at (the shell read it)."""
    if not own:
        return None
    (_, file, line), _ = own.most_common(1)[0]
    text = source.get((file, line)) if line is not None else None
    if not text or not text.strip():
        return None
    code = text.strip()
    return code if len(code) <= MAX_CODE else code[: MAX_CODE - 1] + "…"


MAX_HOT_LOCALS = 4
"""Integer locals of a rank's hot functions given with its hot lines."""


def _hot_locals(own: Counter[_Place], counters: list[dict[str, int]]) -> dict[str, int]:
    """The integer locals of the functions a rank spends its own time in, that stayed put over the
    window: the sizes that make its work (``side=448``), read from the dumps' locals. A loop
    counter that moved tells motion, not size, and ``_`` names are throwaways."""
    functions = {
        f"{os.path.basename(file)}:{function}:" for (function, file, _), _ in own.most_common(MAX_HOT)
    }
    seen = [c for c in counters if c]
    out: dict[str, int] = {}
    for key, value in (seen[-1] if seen else {}).items():
        head, _, name = key.rpartition(":")
        if (
            f"{head}:" not in functions
            or name.startswith("_")
            or any(c.get(key, value) != value for c in seen)
        ):
            continue
        out[name] = value
        if len(out) >= MAX_HOT_LOCALS:
            break
    return out


RUNNABLE_PCT = 50
"""Share of the kernel looks in which a rank that does not wait was running (or ready to run) from
which it computes, whatever CPU time it got: on a loaded host a spinning rank gets little."""


RUNNABLE_MIN_CPU_PCT = 3
"""...and that got at least this much CPU: a starved spinner still gets its share of the cores
(at a load of 16 on 2 cores, about 12%), while a rank that sleeps 50 ms between polls and queues
for a core on every wake-up is runnable in most looks with no CPU at all: it waits, it is not busy."""


def _runnable(kernel: Mapping[str, int], cpu_pct: int | None) -> bool:
    return kernel.get("running", 0) >= RUNNABLE_PCT and (cpu_pct is None or cpu_pct >= RUNNABLE_MIN_CPU_PCT)


def _inner_lines(weighted: list[tuple[list[Frame], int, bool]]) -> int:
    """Distinct innermost Python places below the job's own frame, over the samples that do not wait:
    a compile or a library's loop moves there while the job's own line stands still."""
    inner: set[tuple[str, int | None]] = set()
    for frames, _, waiting in weighted:
        python = [f for f in frames if not f.native]
        if not waiting and python and python[0] is not own_frame(python):
            inner.add((python[0].file, python[0].line))
    return len(inner)


def _signals(w: RankWatch, counters: dict[str, list[int]], places: int, waits: bool) -> list[str]:
    """Which signals moved: counters, io, lines, locals. I/O and locals count only for a rank that
    does not wait (on NCCL a rank that spins for the GPU may still move bytes on other paths)."""
    moved = ["counters"] if counters else []
    if not waits and io_progress(io_moved(w.io), kernel_shares(w.kernel)):
        moved.append("io")
    if places > 1:
        moved.append("lines")
    if not waits and locals_moved(w.reprs):
        moved.append("locals")
    return moved


def watch_rank(w: RankWatch, *, backend: Backend | None, source: Mapping[tuple[str, int], str]) -> RankMotion:
    """How one rank spent the window: its motion, CPU, share of waiting, hot lines, what moved and,
    when only its lines did (or nothing), the loop of its own code it stood in."""
    weighted = [(frames, n, _waiting(frames, backend, source)) for frames, n in _samples(w)]
    own = _own_counts(weighted)
    total = sum(n for _, n, _ in weighted)
    waited = sum(n for _, n, waiting in weighted if waiting)
    places = {_place(frames) for frames in w.looks} | {_place(frames) for frames, _, _ in weighted}
    places.discard(None)
    counters = _moved_counters(w.counters)
    cpu_pct = None if w.cpu_s is None or w.wall_s <= 0 else round(100 * w.cpu_s / w.wall_s)
    queued_pct = None if w.queued_s is None or w.wall_s <= 0 else min(100, round(100 * w.queued_s / w.wall_s))
    last_waits = bool(w.looks) and _waiting(w.looks[-1], backend, source)
    waits = 2 * waited >= total if total else last_waits  # most of its window, not its last instant
    moved = _signals(w, counters, len(places), waits)
    motion: Motion
    if len(w.looks) < 2 and not w.samples:
        motion = "unknown"  # one look shows where a rank is, never whether it moves
    elif moved:
        motion = "moving"
    elif not last_waits and (
        (cpu_pct is not None and cpu_pct >= BUSY_CPU_PCT) or _runnable(kernel_shares(w.kernel), cpu_pct)
    ):
        motion = "busy"
    else:
        motion = "blocked"
    loop = None
    if motion != "unknown" and not waits and set(moved) <= {"lines"} and w.looks:
        loop = stuck_loop([f for f, _, _ in weighted] + w.looks, w.looks[-1], (w.reprs or [{}])[-1], source)
    return RankMotion(
        rank=w.rank,
        motion=motion,
        counters=counters,
        moved_lines=len(places),
        cpu_pct=cpu_pct,
        queued_pct=queued_pct,
        samples=total,
        waiting_pct=100 * waited // total if total else None,
        hot=_hot(own, total),
        hot_locals=_hot_locals(own, [*w.counters, *w.later]),
        hot_code=_top_code(own, source),
        moved=moved if motion != "unknown" else [],
        io=io_moved(w.io),
        kernel=kernel_shares(w.kernel),
        inner_lines=_inner_lines(weighted) if motion != "unknown" else 0,
        loop=loop.at if loop is not None else None,
        loop_values=loop.values if loop is not None else {},
    )


def _job_motion(ranks: list[RankMotion]) -> JobMotion:
    known = [r for r in ranks if r.motion != "unknown"]
    if not known:
        return "unknown"
    if all(r.motion == "moving" for r in known):
        return "moving"
    if not any(r.motion == "blocked" for r in known):
        return "busy"
    return "no_progress"


def _counter_name(key: str) -> str:
    return key.rsplit(":", 1)[-1]


def _best_counter(ranks: list[RankMotion]) -> str | None:
    """The counter that moved on most ranks, known names (step, epoch) first."""
    seen: Counter[str] = Counter(k for r in ranks for k in r.counters)
    if not seen:
        return None

    def order(key: str) -> tuple[int, int, str]:
        name = _counter_name(key).lower()
        known = KNOWN_COUNTERS.index(name) if name in KNOWN_COUNTERS else len(KNOWN_COUNTERS)
        return (-seen[key], known, key)

    return min(seen, key=order)


def counters_phrase(ranks: list[RankMotion], window_s: float) -> str | None:
    """``step 421 → 547 on every rank in 1.2 s``: the counter that moved, and on whom."""
    key = _best_counter(ranks)
    if key is None:
        return None
    moved = {r.rank: r.counters[key] for r in ranks if key in r.counters}
    firsts = {v[0] for v in moved.values()}
    lasts = {v[1] for v in moved.values()}
    known = [r for r in ranks if r.motion != "unknown"]
    who = "every rank" if len(moved) == len(known) and len(known) > 1 else ranks_phrase(sorted(moved))
    name = _counter_name(key)
    change = f"{name} {value_span(firsts)} → {value_span(lasts)}"
    return f"{change} on {who} in {window_s:.1f} s"


def wait_words(backend: Backend | None) -> str:
    """What waiting means on this backend: on gloo there is no GPU to wait for."""
    return "in collectives" if backend == "gloo" else "in collectives or for the GPU"


def _share_phrase(ranks: list[RankMotion], backend: Backend | None) -> str | None:
    shares = [r.waiting_pct for r in ranks if r.waiting_pct is not None]
    if not shares:
        return None
    lo, hi = min(shares), max(shares)
    span = f"{lo}%" if lo == hi else f"{lo}-{hi}%"
    return f"waiting {wait_words(backend)} {span} of the samples, the rest in their own code"


STARVED_CPU_RATIO = 1.5
"""A lagging rank that used at most this many times the CPU of the others did no more work than they did."""

STARVED_CPU_SLACK_PCT = 3
"""...give or take this many points: CPU time is counted in 10 ms ticks, so over a window of about a
second a rank starved to a few % of a core reads a point or two either way."""


def _lag(ranks: Sequence[RankMotion]) -> tuple[RankMotion, int] | None:
    """The rank that waits least, and by how many points less than every other rank, where it waits
    at least :data:`STRAGGLER_GAP_PCT` points less and the others wait more than
    :data:`STRAGGLER_OTHERS_WAIT_PCT` % (median): a job whose ranks all compute most of the time
    has no straggler, whatever their small differences."""
    measured = [r for r in ranks if r.waiting_pct is not None and r.samples >= 3]
    if len(measured) < 2:
        return None
    low = min(measured, key=lambda r: (r.waiting_pct or 0, r.rank))
    others = [r.waiting_pct or 0 for r in measured if r.rank != low.rank]
    gap = min(others) - (low.waiting_pct or 0)
    if gap < STRAGGLER_GAP_PCT or statistics.median(others) < STRAGGLER_OTHERS_WAIT_PCT:
        return None
    return low, gap


def _starved(low: RankMotion, gap: int, ranks: Sequence[RankMotion]) -> bool:
    """Whether the lag is the host's scheduler's, not the rank's work: it queued for a core for at
    least half its lag and used no more CPU than the others (on an oversubscribed host the rank
    that lags changes from window to window). Unknown run-queue or CPU time is never starvation."""
    cpus = [r.cpu_pct for r in ranks if r.rank != low.rank and r.cpu_pct is not None]
    if low.queued_pct is None or low.cpu_pct is None or not cpus:
        return False
    return 2 * low.queued_pct >= gap and low.cpu_pct <= STARVED_CPU_RATIO * max(cpus) + STARVED_CPU_SLACK_PCT


def _lag_reading(ranks: Sequence[RankMotion]) -> tuple[int | None, str | None]:
    """The straggler, or else the phrase ``rank 0 waits less (66%) only because it queued for a core …``
    where the rank that waits least lagged from the host's oversubscribed cores (:func:`_starved`);
    (None, None) where no rank lags."""
    lag = _lag(ranks)
    if lag is None:
        return None, None
    low, gap = lag
    if not _starved(low, gap, ranks):
        return low.rank, None
    return None, (
        f"rank {low.rank} waits less ({low.waiting_pct}%) only because it queued for a core "
        f"{low.queued_pct}% of the window, with no more CPU than the others: the host's cores are "
        "oversubscribed, its code is not slower"
    )


def find_straggler(ranks: Sequence[RankMotion]) -> int | None:
    """The one rank that rarely waits while the others mostly wait (for it), or None; None too when
    it lagged only while waiting for a core (:func:`_starved`)."""
    return _lag_reading(ranks)[0]


def _cpu_words(r: RankMotion) -> str:
    """`` (CPU 3%, queued for a core 95%)``; empty where its CPU is unknown."""
    return f" (CPU {r.cpu_pct}%{queued_words(r)})" if r.cpu_pct is not None else ""


def _no_progress_phrase(ranks: list[RankMotion], window_s: float) -> str:
    blocked = sorted(r.rank for r in ranks if r.motion == "blocked")
    active = [r for r in ranks if r.motion in ("busy", "moving")]
    text = f"nothing moved in {window_s:.1f} s on {ranks_phrase(blocked)}: same stack, counters unchanged"
    cpus = [r.cpu_pct for r in ranks if r.motion == "blocked" and r.cpu_pct is not None]
    if cpus:
        text += f", CPU {max(cpus)}% at most" if max(cpus) < BUSY_CPU_PCT else ", CPU spinning in a wait"
    for r in active:
        text += f"; rank {r.rank} {'moves' if r.motion == 'moving' else 'is busy'}"
        text += _cpu_words(r)
        if r.hot:
            text += f" in {r.hot[0]}"
    return text


def judge(
    watches: Sequence[RankWatch],
    *,
    backend: Backend | None,
    source: Mapping[tuple[str, int], str] | None = None,
    window_s: float,
) -> Progress:
    """Whether the job moved during the window, rank by rank, and where its time goes."""
    src = source or {}
    ranks = [watch_rank(w, backend=backend, source=src) for w in watches]
    return summarize(ranks, window_s=window_s, backend=backend)


def summarize(ranks: Sequence[RankMotion], *, window_s: float, backend: Backend | None) -> Progress:
    """The job's motion, straggler and summary from what each rank did."""
    ranks = sorted(ranks, key=lambda r: r.rank)
    motion = _job_motion(ranks)
    looks = max((r.samples for r in ranks), default=0)
    straggler, starved = _lag_reading(ranks) if motion == "moving" else (None, None)
    if motion == "moving":
        moved = counters_phrase(ranks, window_s)
        lines = f"the lines of their own code changed on every rank in {window_s:.1f} s"
        if any("lines" not in r.moved for r in ranks if r.motion == "moving"):
            signals = sorted({s for r in ranks for s in r.moved})
            lines = f"every rank moved ({', '.join(signals)}) in {window_s:.1f} s"
        summary = "; ".join(p for p in (moved or lines, _share_phrase(ranks, backend), starved) if p)
    elif motion == "busy":
        summary = f"no counter moved in {window_s:.1f} s, but no rank is blocked: " + "; ".join(
            f"rank {r.rank} {r.motion}{_cpu_words(r)}" for r in ranks
        )
    elif motion == "no_progress":
        summary = _no_progress_phrase(ranks, window_s)
    else:
        summary = "each rank was looked at once: whether the job moves was not checked"
    return Progress(
        motion=motion,
        window_s=round(window_s, 2),
        looks=looks,
        summary=summary,
        straggler=straggler,
        ranks=ranks,
    )


def merge_progress(parts: Sequence[Progress], backend: Backend | None) -> Progress | None:
    """One job's progress from each host's: the ranks of all hosts, judged together."""
    if not parts:
        return None
    ranks = [r for p in parts for r in p.ranks]
    return summarize(ranks, window_s=max(p.window_s for p in parts), backend=backend)


RECORDER_KEY = "flight recorder:collectives:completed_seq"
"""The progress counter the recorder gives: each rank's last completed collective sequence number."""


def recorder_completed(flight: FlightReport | None) -> dict[int, int]:
    """Each rank's last completed collective sequence number, summed over its process groups (a
    rank that completes a collective on any group moved)."""
    out: dict[int, int] = {}
    for group in flight.process_groups if flight is not None else []:
        for p in group.progress:
            if p.last_completed is not None:
                out[p.rank] = out.get(p.rank, 0) + p.last_completed
    return out


def with_recorder(
    watches: Sequence[RankWatch], before: FlightReport | None, after: FlightReport | None
) -> None:
    """Add the recorder's completed sequence numbers at both ends of the window to each rank's counters."""
    first, last = recorder_completed(before), recorder_completed(after)
    for w in watches:
        if w.rank in first and w.rank in last and len(w.counters) >= 2:
            w.counters[0] = {**w.counters[0], RECORDER_KEY: first[w.rank]}
            w.counters[-1] = {**w.counters[-1], RECORDER_KEY: last[w.rank]}


def place_lines(watches: Sequence[RankWatch]) -> set[tuple[str, int]]:
    """The (file, line) of every place of the job's own code the looks saw: the shell reads their
    source text, which tells a GPU wait (``loss.item()``) from compute; and, around the own frames
    of each rank's last dump, the lines of the loops they stand in (header above, exits below)."""
    wanted: set[tuple[str, int]] = set()
    for w in watches:
        for frames in [*w.looks, *(f for f, _ in w.samples)]:
            own = own_frame(frames)
            if own is not None and own.line is not None:
                wanted.add((own.file, own.line))
        if w.looks:
            wanted |= lines_around(w.looks[-1], LOOP_LOOK_BACK)
    return wanted


__all__ = [
    "BUSY_CPU_PCT",
    "RankWatch",
    "counters_phrase",
    "find_straggler",
    "judge",
    "merge_progress",
    "own_frame",
    "parse_record",
    "place_lines",
    "recorder_completed",
    "summarize",
    "watch_rank",
    "with_recorder",
]
