"""The verdicts a job that is not hung gets: ``progressing``, ``straggler`` and ``busy``.

They are read before any hang rule (:func:`rankscope.analysis.hang.stacks.analyze`): a job that
moved during the window is never called hung, a rank whose I/O moves while the others wait is a
straggler (slow I/O), and a job whose only ranks that do not wait compute in their own code is
"no progress yet", not a deadlock, until a window of :data:`STUCK_WINDOW_S` shows such a rank
standing in one loop with nothing moving: then it is stuck there (``divergent_ranks``, with the
loop's condition and the values it reads). Everything else goes to the hang rules, with what
the window saw added to their evidence.
"""

from __future__ import annotations

from rankscope.analysis.hang.frames import short_site
from rankscope.analysis.hang.progress_signals import QUEUED_NOTE_PCT, io_phrase, kernel_phrase, queued_words
from rankscope.analysis.hang.waits import GPU_LIKE, wait_phrase
from rankscope.analysis.ranges import ranks_phrase, value_span
from rankscope.models.core import Confidence, NextStep, RankStack, Verdict
from rankscope.models.progress import Progress, RankMotion

BUSY_CPU_PCT = 25
"""CPU of its own, in % of one core over the window, above which a rank that stands still computes."""

PROGRESS_KINDS = ("progressing", "straggler", "busy")
"""The verdict kinds of a job that is not hung."""

OWN_TIME_PCT = 50
"""A rank that waits less than this share of its samples spends most of its time in its own code: the
integer locals there (sizes, counts) are worth quoting."""

STUCK_WINDOW_S = 10.0
"""A window at least this long concludes: a rank that stood in one loop with nothing moving is stuck
there. It is the shortest window a ``busy`` answer asks for, so the window it asks for always concludes."""

_SECTION = "skill/hangs.md#"
MAX_EVIDENCE_RANKS = 6
"""Ranks given an evidence line of their own; the rest are summed up in one."""


def _step(
    section: str, action: str, tool: str | None = None, args: dict[str, object] | None = None
) -> NextStep:
    return NextStep(action=action, tool=tool, args=args, skill_section=_SECTION + section)


def _oversubscribed(progress: Progress, section: str) -> list[NextStep]:
    """A step on the host's cores where a rank that does not mostly wait queued for a core most of
    the window: its slowness is the scheduler's, and the fix is on the host, not in its code."""
    queued = [
        r
        for r in progress.ranks
        if r.queued_pct is not None
        and r.queued_pct >= QUEUED_NOTE_PCT
        and (r.waiting_pct or 0) < OWN_TIME_PCT
    ]
    if not queued:
        return []
    who = ranks_phrase([r.rank for r in queued])
    share = value_span([r.queued_pct or 0 for r in queued], "%")
    return [
        _step(
            section,
            f"{who} queued for a core {share} of the window: the host's cores are oversubscribed. Count what "
            "runs there (other jobs, `top -H`), each rank's threads (OMP_NUM_THREADS, torch.get_num_threads()) "
            "and DataLoader workers against the cores.",
        )
    ]


def locals_phrase(r: RankMotion) -> str:
    """``side=448, n=16``: the integer locals of a rank's hot functions, or nothing."""
    return ", ".join(f"{name}={value}" for name, value in r.hot_locals.items())


def _hot_with_code(r: RankMotion) -> str:
    """Its hot lines, the first with its source text: ``load_batch (train.py:18) 25% `x = f(side)`, ...``."""
    first = f"{r.hot[0]} `{r.hot_code}`" if r.hot_code else r.hot[0]
    return ", ".join([first, *r.hot[1:]])


def moved_phrase(r: RankMotion, window_s: float) -> str:
    """``moved: step 3 → 5, io (writing: 5.0 MiB in 1.2 s, 5.0 MiB/s), lines (2 places)`` or ``nothing
    moved (counters, I/O, lines, locals)``: which signals decided that a rank moves, or that none did."""
    if not r.moved:
        return "nothing moved (counters, I/O, lines, locals)"
    words = []
    for signal in r.moved:
        if signal == "counters" and r.counters:
            key, (a, b) = next(iter(r.counters.items()))
            words.append(f"{key.rsplit(':', 1)[-1]} {a} → {b}")
        elif signal == "io":
            told = io_phrase(r.io, r.kernel, window_s)
            words.append(f"io ({told})" if told else "io")
        elif signal == "lines":
            words.append(f"lines ({r.moved_lines} places)")
        else:
            words.append(signal)
    return "moved: " + ", ".join(words)


def _rank_line(r: RankMotion, told: bool = False, window_s: float | None = None) -> str:
    """One rank's line; ``window_s`` given for a rank the verdict names: which signals moved, and
    where it was in the kernel, are said too."""
    parts = [f"rank {r.rank}: {r.motion}"]
    if window_s is not None and r.motion != "unknown":
        parts.append(moved_phrase(r, window_s))  # its counter too, when one moved
    elif r.counters:
        key, (a, b) = next(iter(r.counters.items()))
        parts.append(f"{key.rsplit(':', 1)[-1]} {a} → {b}")
    if r.waiting_pct is not None:
        parts.append(f"waiting {r.waiting_pct}% of {r.samples} samples")
    if r.cpu_pct is not None:
        parts.append(f"CPU {r.cpu_pct}%{queued_words(r)}")
    kernel = kernel_phrase(r.kernel) if window_s is not None and r.kernel.get("running", 0) < 100 else None
    if kernel:
        parts.append(f"kernel: {kernel}")
    if r.hot and not told:
        parts.append("own code: " + ", ".join(r.hot))
        if r.hot_locals and (r.waiting_pct or 0) < OWN_TIME_PCT:
            parts.append(f"locals there: {locals_phrase(r)}")
    return "; ".join(parts)


def evidence(
    progress: Progress,
    first: list[int] | None = None,
    told: int | None = None,
    shown: int = MAX_EVIDENCE_RANKS,
) -> list[str]:
    """The window in a few lines: the summary, then the ranks that matter first (``shown`` at most),
    the rest summed up. ``told``: the rank whose hot lines the verdict's summary already gives."""
    lines = [f"window: {progress.summary}"]
    lead = set(first or [])
    ordered = sorted(progress.ranks, key=lambda r: (r.rank not in lead, r.rank))
    lines += [
        _rank_line(r, r.rank == told, progress.window_s if r.rank in lead else None) for r in ordered[:shown]
    ]
    rest = ordered[shown:]
    if rest:
        waits = [r.waiting_pct for r in rest if r.waiting_pct is not None]
        span = f", waiting {value_span(waits, '%')}" if waits else ""
        cpus = [r.cpu_pct for r in rest if r.cpu_pct is not None]
        cpu = f", CPU {value_span(cpus, '%')}" if cpus else ""
        motions = ", ".join(sorted({r.motion for r in rest}))
        lines.append(f"{ranks_phrase([r.rank for r in rest])}: {motions}{span}{cpu}")
    return lines


def _wider(progress: Progress) -> int:
    return int(max(STUCK_WINDOW_S, round(progress.window_s * 10)))


def _own_time(progress: Progress) -> str:
    """``; its own time goes to evaluate (eval.py:50) on every rank`` when the ranks agree on their top line."""
    tops = {r.hot[0].rsplit(" ", 1)[0] for r in progress.ranks if r.hot}
    if len(tops) == 1 and all(r.hot for r in progress.ranks if r.motion != "unknown"):
        return f"; its own time goes to {tops.pop()} on every rank"
    return ""


def _progressing(progress: Progress) -> Verdict:
    counted = all(r.counters for r in progress.ranks if r.motion != "unknown")
    first = _oversubscribed(progress, "progressing") or [
        _step(
            "progressing",
            "Nothing to fix here. If it is slower than expected, profile a few steps (torch.profiler) and compare "
            "the time per step with the last good run; if it stops later, call dump_stacks again then.",
        )
    ]
    return Verdict(
        kind="progressing",
        confidence="high" if counted else "medium",
        summary=f"the job makes progress, it is not hung: {progress.summary}{_own_time(progress)}; no rank holds "
        "the others back",
        evidence=evidence(progress),
        next_steps=[
            *first,
            _step(
                "progressing",
                "A step longer than the window can hide a stall: watch longer.",
                "dump_stacks",
                {"window_s": _wider(progress)},
            ),
        ],
    )


def _straggler(progress: Progress) -> Verdict:
    rank = progress.straggler
    if rank is None:  # pragma: no cover - only called with a straggler
        raise ValueError("no straggler")
    r = next(m for m in progress.ranks if m.rank == rank)
    others = [m.waiting_pct or 0 for m in progress.ranks if m.rank != rank and m.waiting_pct is not None]
    strong = r.samples >= 20 and (r.waiting_pct or 0) <= 20 and min(others, default=0) >= 60
    confidence: Confidence = "high" if strong else "medium"
    where = f"; its time goes to {_hot_with_code(r)}" if r.hot else ""
    if r.hot_locals:
        where += f", where {locals_phrase(r)}"
    io = io_phrase(r.io, r.kernel, progress.window_s) if "io" in r.moved else None
    if io:
        where += f"; it is {io}"
    return Verdict(
        kind="straggler",
        suspect_ranks=[rank],
        confidence=confidence,
        summary=f"the job makes progress but rank {rank} holds it back: it waits {r.waiting_pct}% of the time, the "
        f"others {value_span(others, '%')} (for it){where}. Slow, not hung",
        evidence=evidence(progress, [rank], told=rank, shown=1),  # the others only wait: summed up
        next_steps=[
            _step(
                "straggler",
                f"Read rank {rank}'s hot lines: why it does more work per step than the others (a bigger data shard, "
                "longer sequences or larger images, a rank-dependent branch, a slower device or host).",
            ),
            _step(
                "straggler",
                f"Read rank {rank}'s locals at those lines (sizes, shard, path) against another rank's.",
                "dump_stacks",
                {
                    "locals": True,
                    "full_ranks": [rank, next(m.rank for m in progress.ranks if m.rank != rank)],
                },
            ),
            *_oversubscribed(progress, "straggler"),
        ],
    )


def _waits(stack: RankStack) -> bool:
    return bool(stack.op) or stack.wait in GPU_LIKE or stack.wait == "collective"


def _busy_phrase(r: RankMotion) -> str:
    cpu = f", CPU {r.cpu_pct}%{queued_words(r)}" if r.cpu_pct is not None else ""
    where = f" in {r.hot[0]}" if r.hot else " in its own code"
    return f"rank {r.rank} is busy{where}{cpu}"


def _waiting_phrase(blocked: list[RankMotion], by_rank: dict[int, RankStack]) -> str:
    """``ranks 1-3 wait in barrier at train.py:77``: the blocked ranks by what they wait in."""
    places: dict[str, list[int]] = {}
    for r in blocked:
        s = by_rank.get(r.rank)
        site = f" at {short_site(s.call_site)}" if s is not None and s.call_site is not None else ""
        if s is not None and s.op:
            what = f"in {s.op}"
        else:
            what = wait_phrase((s.wait if s is not None else None) or "other").removeprefix("wait ")
        places.setdefault(f"{what}{site}", []).append(r.rank)
    return "; ".join(
        f"{ranks_phrase(ranks)} wait{'s' if len(ranks) == 1 else ''} {what}" for what, ranks in places.items()
    )


def _busy(progress: Progress, annotated: list[RankStack]) -> Verdict | None:
    """Nothing completed, but the ranks that do not wait work in their own code: a rank whose I/O
    moves is a straggler (slow I/O); over a window of :data:`STUCK_WINDOW_S` a rank that stood in one
    loop with nothing moving is stuck there; otherwise busy."""
    by_rank = {s.rank: s for s in annotated if s.rank is not None}
    active = [
        r
        for r in progress.ranks
        if r.motion in ("busy", "moving") and not (r.rank in by_rank and _waits(by_rank[r.rank]))
    ]
    blocked = [r for r in progress.ranks if r.motion == "blocked"]
    concludes = progress.window_s >= STUCK_WINDOW_S
    stuck = _stuck_ranks(progress, by_rank) if concludes else []
    if stuck:
        rest = [r for r in progress.ranks if r not in stuck]
        return stuck_verdict(progress, stuck, _waiting_phrase(rest, by_rank))
    if not active or any(r.rank in by_rank and not _waits(by_rank[r.rank]) for r in blocked):
        return None
    if blocked and all("io" in r.moved for r in active):
        return _io_straggler(progress, active, _waiting_phrase(blocked, by_rank))
    return _busy_verdict(progress, active, blocked, by_rank, concludes)


CALL_MOVES = 4
"""Distinct places inside the call a rank stands in (below its own line) from which that call is taken
to work (a compile, a library's loop): over a long window such a rank is slow, not stuck."""

_SLEEPS = ("timer", "running")
"""Kernel waits of a rank that polls: it sleeps in a timer between its looks, or runs."""


def _stuck_ranks(progress: Progress, by_rank: dict[int, RankStack]) -> list[RankMotion]:
    """The ranks a long window saw stand in their own code with nothing but their lines moving, while
    every other rank waits in a collective: busy in one loop (or at one line), or asleep in a ``while``
    loop that polls (a rank blocked on a queue, a lock or a socket is left to the hang rules)."""

    def stands(r: RankMotion) -> bool:
        if r.motion == "unknown" or set(r.moved) - {"lines"}:
            return False
        if r.rank in by_rank and _waits(by_rank[r.rank]):
            return False
        if r.motion == "blocked":
            polls = not r.kernel or next(iter(r.kernel)) in _SLEEPS
            return bool(r.loop) and "`while " in (r.loop or "") and polls
        return bool(r.loop) or (not r.moved and r.inner_lines < CALL_MOVES)

    stuck = [r for r in progress.ranks if stands(r)]
    rest = [r for r in progress.ranks if r not in stuck]
    if not rest or any(
        r.motion != "blocked" or r.rank not in by_rank or not _waits(by_rank[r.rank]) for r in rest
    ):
        return []
    return stuck


def _busy_verdict(
    progress: Progress,
    active: list[RankMotion],
    blocked: list[RankMotion],
    by_rank: dict[int, RankStack],
    concludes: bool,
) -> Verdict:
    who = ranks_phrase([r.rank for r in active])
    wide = _wider(progress)
    where = "; ".join(_busy_phrase(r) for r in active)
    if blocked and concludes:
        signals = sorted({s for r in active for s in r.moved} - {"lines"}) or ["lines"]
        moved = (
            f"its {', '.join(signals)} moved" if any(r.moved for r in active) else "the call it is in moves"
        )
        summary = (
            f"no progress in {progress.window_s:.1f} s: {_waiting_phrase(blocked, by_rank)} while {where}: "
            f"{who} hold{'s' if len(active) == 1 else ''} the others back; {moved}: slow, not stuck"
        )
    elif blocked:
        summary = (
            f"no progress in {progress.window_s:.1f} s: {_waiting_phrase(blocked, by_rank)} while {where}: "
            f"{who} hold{'s' if len(active) == 1 else ''} the others back. Not a deadlock as far as this window "
            "shows: slow or stuck cannot be told yet"
        )
    else:
        summary = (
            f"no counter moved in {progress.window_s:.1f} s, but no rank is blocked: {where}: slow, not stuck"
        )
    return Verdict(
        kind="busy",
        suspect_ranks=[r.rank for r in active] if blocked else [],
        confidence="medium",
        summary=summary,
        evidence=evidence(progress, [r.rank for r in active]),
        next_steps=[
            _step(
                "busy",
                f"Look again over {wide} s: if {who} reach{'es' if len(active) == 1 else ''} the collective and the "
                "counters move, the job is slow; if they stand at the same lines with no counter moving, they are "
                "stuck there (an endless loop, a retry, a compile that never ends).",
                "dump_stacks",
                {"window_s": wide},
            ),
            *_oversubscribed(progress, "busy"),
            _step(
                "busy",
                f"Read {who}'s hot lines: an evaluation, checkpoint save or data preparation that only "
                f"{'it runs' if len(active) == 1 else 'they run'} holds the others in their collective.",
            ),
        ],
    )


def _io_straggler(progress: Progress, active: list[RankMotion], waiting: str) -> Verdict:
    """The ranks that do not wait move bytes (a checkpoint written to a slow file system): slow, not hung."""
    who = ranks_phrase([r.rank for r in active])
    doing = "; ".join(
        f"rank {r.rank} is {io_phrase(r.io, r.kernel, progress.window_s) or 'in I/O'}"
        + (f" in {r.hot[0].rsplit(' ', 1)[0]}" if r.hot else "")
        for r in active
    )
    moved_bytes = all(io_phrase(r.io, {}, progress.window_s) for r in active)
    one = len(active) == 1
    return Verdict(
        kind="straggler",
        suspect_ranks=[r.rank for r in active],
        confidence="high" if moved_bytes else "medium",
        summary=f"{doing} while {waiting}: {who} hold{'s' if one else ''} the others back with I/O. Slow, not hung",
        evidence=evidence(progress, [r.rank for r in active]),
        next_steps=[
            _step(
                "straggler",
                f"Read {who}'s hot lines: a checkpoint or log written to a slow file system, or data read from one, "
                f"while the others wait in their collective. If it is too slow: write from fewer ranks, "
                "asynchronously, or to faster storage; give the group a `timeout=` longer than the write.",
            ),
            _step(
                "straggler",
                "If the I/O ends and the job still does not move, look again.",
                "dump_stacks",
                {"window_s": _wider(progress)},
            ),
        ],
    )


def _stuck_phrase(r: RankMotion) -> str:
    """``rank 1 is stuck in the loop at poll.py:40 `while not os.path.exists(p)`, whose condition reads
    p='/data/ready'``, or, with no loop read, where it stood."""
    if r.loop:
        text = f"rank {r.rank} is stuck in the loop at {r.loop}"
        if r.loop_values:
            values = ", ".join(f"{k}={v}" for k, v in r.loop_values.items())
            text += f", whose condition reads {values}, unchanged"
    else:
        where = r.hot[0].rsplit(" ", 1)[0] if r.hot else "its own code"
        text = f"rank {r.rank} is stuck at {where}" + (f" `{r.hot_code}`" if r.hot_code else "")
        text += " (or in one call longer than the window)"
    return text


def stuck_verdict(progress: Progress, stuck: list[RankMotion], waiting: str) -> Verdict:
    """A window long enough saw these ranks stand in their own code, in one loop (or at one line), with
    no counter, I/O or local moving, while the others wait in a collective: a hang, and the loop's
    condition is why."""
    who = ranks_phrase([r.rank for r in stuck])
    one = len(stuck) == 1
    cpus = [r.cpu_pct for r in stuck if r.cpu_pct is not None]
    cpu = f"; CPU {value_span(cpus, '%')}" if cpus else ""
    lines = any(r.moved for r in stuck)
    what, signals = ("nothing but its lines", "I/O or local") if lines else ("nothing", "I/O, line or local")
    summary = (
        f"{'; '.join(_stuck_phrase(r) for r in stuck)}: {what} moved in {progress.window_s:.1f} s "
        f"(no counter, {signals}{cpu}) while {waiting}: {who} never reached the collective "
        "the others wait in"
    )
    looped = all(r.loop for r in stuck)
    return Verdict(
        kind="divergent_ranks",
        suspect_ranks=[r.rank for r in stuck],
        confidence="high" if looped else "medium",
        summary=summary,
        # analyze() leads with the window's line; the others only wait: summed up
        evidence=evidence(progress, [r.rank for r in stuck], shown=len(stuck))[1:],
        next_steps=[
            _step(
                "stuck",
                f"Read the condition of the loop {who} {'stands' if one else 'stand'} in and find what should change "
                "the values it reads (a file another rank or process writes, a flag another thread sets, a peer "
                "that answers) and why it does not; bound the loop with a timeout that raises.",
            ),
            _step(
                "stuck",
                f"What {who} {'waits' if one else 'wait'} on, native frames and locals included.",
                "dump_stacks",
                {"native": True, "locals": True, "full_ranks": [r.rank for r in stuck]},
            ),
        ],
    )


def progress_verdict(progress: Progress | None, annotated: list[RankStack]) -> Verdict | None:
    """The verdict of a job that is not hung, or None when the hang rules must decide."""
    if progress is None:
        return None
    if progress.motion == "moving":
        return _straggler(progress) if progress.straggler is not None else _progressing(progress)
    if progress.motion in ("busy", "no_progress"):
        return _busy(progress, annotated)
    return None


__all__ = [
    "BUSY_CPU_PCT",
    "PROGRESS_KINDS",
    "STUCK_WINDOW_S",
    "evidence",
    "locals_phrase",
    "moved_phrase",
    "progress_verdict",
    "stuck_verdict",
]
