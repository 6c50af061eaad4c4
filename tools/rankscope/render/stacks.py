"""The human view of a StacksReport: yields lines, the command prints them.

Identical main-thread stacks are collapsed with their rank list ("ranks 0-2,4"); in the
other groups the frames that differ from the largest group are marked with ``>`` and the
frames they share are folded, so the odd ranks stand out. The verdict and next steps
come last, where the eye lands.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from rankscope.analysis.hang.collectives import classify_native_frame, frame_key
from rankscope.analysis.hang.frames import short_path
from rankscope.analysis.hang.waits import GPU_LIKE, wait_phrase
from rankscope.analysis.p2p import P2P_DIRECTION
from rankscope.analysis.ranges import rank_ranges, ranks_phrase
from rankscope.analysis.sizing.bound import RANKS_CUT
from rankscope.models.core import Frame, Group, StacksReport
from rankscope.render.next_steps import brief_next_steps, render_next_steps

_STATE_NOTE = {
    "stopped": "process stopped (T): not sampled",
    "tracing_stop": "process stopped by a tracer (t): not sampled",
    "disk_sleep": "process in uninterruptible sleep (D)",
    "zombie": "process exited (zombie)",
    "dead": "process gone",
}


def _frame_text(frame: Frame) -> str:
    if frame.native:
        lib = os.path.basename(frame.module or frame.file)
        return f"{frame.function[:120]} [{lib}]"
    path = short_path(frame.file)
    return (
        f"{frame.function} ({path}:{frame.line})" if frame.line is not None else f"{frame.function} ({path})"
    )


def _key(frame: Frame) -> tuple[str, str, int]:
    return frame_key(frame.function, frame.file, frame.line)


def _visible(frames: list[Frame]) -> list[Frame]:
    """Python frames plus the native frames that say something about communication."""
    return [f for f in frames if not f.native or classify_native_frame(f.function) is not None]


def _shared_wait(group: Group, waits: dict[int, str | None]) -> str | None:
    """What every rank of the group waits for, when they agree."""
    kinds = {waits.get(r) for r in group.ranks}
    return next(iter(kinds)) if len(kinds) == 1 else None


def _group_lines(
    group: Group, reference: Group | None, suspects: set[int], waits: dict[int, str | None]
) -> Iterator[str]:
    mark = "  <- suspect" if suspects & set(group.ranks) else ""
    what = f"{group.op} at " if group.op else "no collective, at "
    site = str(group.call_site) if group.call_site else "unknown site"
    wait = _shared_wait(group, waits)
    label = f" [{wait_phrase(wait).replace('wait ', 'waits ', 1)}]" if wait in GPU_LIKE else ""
    yield f"== {ranks_phrase(group.ranks)} ({len(group.ranks)}): {what}{site}{label}{mark}"
    frames = _visible(group.frames)
    if reference is None or reference is group:
        for frame in frames:
            yield f"     {_frame_text(frame)}"
        return
    ref = {_key(f) for f in _visible(reference.frames)}
    shared_tail = 0
    for frame in reversed(frames):
        if _key(frame) not in ref:
            break
        shared_tail += 1
    head = frames[: len(frames) - shared_tail]
    for frame in head:
        yield f"   > {_frame_text(frame)}"
    if shared_tail:
        yield f"     ... {shared_tail} outer frame(s) shared with {ranks_phrase(reference.ranks)}"


def verdict_label(report: StacksReport) -> str:
    """``verdict``, or ``verdict on rank 2 alone`` for a capture of some ranks: a reader who stops
    at the first word must not take one rank's verdict for the job's."""
    return f"verdict on {ranks_phrase(report.only_ranks)} alone" if report.only_ranks else "verdict"


def render_stacks(report: StacksReport) -> Iterator[str]:
    """Lines for a terminal: job, collapsed stack groups, stuck ranks, errors, verdict."""
    job = report.job
    here = sorted(r.rank for r in job.ranks if r.rank is not None)
    launcher = f"{job.launcher}" + (f" pid {job.launcher_pid}" if job.launcher_pid else "")
    yield (
        f"job {job.job_id} ({launcher}), world size {job.world_size if job.world_size else '?'}, "
        f"host(s) {', '.join(job.hosts) or '?'}" + (f", backend {job.backend}" if job.backend else "")
    )
    line = f"ranks found: {rank_ranges(here)}"
    if job.missing_ranks:
        line += f"; missing: {rank_ranges(job.missing_ranks)}"
    if job.exited_ranks:
        line += f"; exited: {rank_ranges(job.exited_ranks)}"
    yield line
    for note in job.notes:
        yield f"note: {note}"
    yield ""
    suspects = set(report.verdict.suspect_ranks)
    waits: dict[int, str | None] = {s.rank: s.wait for s in report.stacks if s.rank is not None}
    groups = report.stack_groups
    reference = groups[0] if groups else None
    for group in groups:
        yield from _group_lines(group, reference, suspects, waits)
        others = _other_threads(report, group.ranks[0])
        if others:
            yield f"     (+ {others} other thread(s) per rank; --json --full has them all)"
        yield ""
    for group in report.groups:
        if group.state is not None:
            mark = "  <- suspect" if suspects & set(group.ranks) else ""
            yield f"== {ranks_phrase(group.ranks)}: {_STATE_NOTE.get(group.state, group.state)}{mark}"
            yield ""
    for err in report.errors:
        parts = [
            f"rank {err.rank}" if err.rank is not None else "",
            f"pid {err.pid}" if err.pid is not None else "",
        ]
        parts.append(f"host {err.host}" if err.host and err.rank is None else "")
        who = ", ".join(p for p in parts if p) or "capture"
        yield f"error: {who}: {err.kind}: {err.message}"
        if err.fix:
            yield f"       fix: {err.fix}"
    if report.errors:
        yield ""
    if report.progress is not None:
        yield f"progress over {report.progress.window_s:.1f} s: {report.progress.summary}"
    verdict = report.verdict
    yield (
        f"{verdict_label(report)}: {verdict.kind}"
        + (f" (suspects: {ranks_phrase(verdict.suspect_ranks)})" if verdict.suspect_ranks else "")
        + (f", confidence {verdict.confidence}" if verdict.confidence else "")
    )
    yield f"  {verdict.summary}"
    yield from _peer_lines(report)
    yield from render_next_steps(verdict.next_steps)
    if report.truncated and report.hint:
        yield f"(truncated: {report.hint})"


MAX_PEERS_SHOWN = 16


def _peer_lines(report: StacksReport) -> Iterator[str]:
    """``send/recv: 0<-1, 1<-2, 2->0``: who each rank blocked in a send/recv waits on (NCCL's notation)."""
    pairs = [
        f"{s.rank}{'->' if P2P_DIRECTION.get(s.op or '') == 'send' else '<-'}{s.peer}"
        for s in report.stacks
        if s.rank is not None and s.peer is not None
    ]
    if pairs:
        more = len(pairs) - MAX_PEERS_SHOWN
        yield "  send/recv: " + ", ".join(pairs[:MAX_PEERS_SHOWN]) + (f" (+{more} more)" if more > 0 else "")


def _other_threads(report: StacksReport, rank: int) -> int:
    for stack in report.stacks:
        if stack.rank == rank:
            return max(len(stack.threads) - 1, 0)
    return 0


MAX_BRIEF_FRAMES = 6


def _brief_frames(group: Group, seen: set[str]) -> str:
    """A group's stack outside its call site on one line, innermost first (the header names the
    op and the call site). A file is spelled out once per answer (``seen``), then by its base name."""
    frames = [f for f in _visible(group.frames) if not f.native]
    site = group.call_site
    at = next(
        (i for i, f in enumerate(frames) if site is not None and (f.file, f.line) == (site.file, site.line)),
        None,
    )
    if at is not None:
        frames = frames[at + 1 :]
    if frames and frames[-1].function == "<module>":
        frames = frames[:-1]  # the script's entry line: the same on every rank, it tells nothing here
    return " < ".join(
        _spelled_once(_frame_text(frame), frame.file, seen) for frame in frames[:MAX_BRIEF_FRAMES]
    )


def _spelled_once(text: str, file: str, seen: set[str]) -> str:
    """``text`` with ``file`` by its base name when this answer already spelled it out (``seen``)."""
    out = text.replace(file, os.path.basename(file)) if file in seen else text
    seen.add(file)
    return out


_RANK_PREFIX = re.compile(r"^ranks? [\d,\- ]+: ")


def _said(item: str, summary: str) -> bool:
    """True when an evidence line says nothing the summary does not (its bracketed frame aside)."""
    text = _RANK_PREFIX.sub("", item.split(" [", 1)[0])
    return len(text) > 20 and text in summary


def _shown_stacks(report: StacksReport) -> Iterator[str]:
    """The main thread of each rank whose stack the answer kept whole (``full_ranks``, CLI
    ``--show-rank``), innermost frame first: what the call asked to see, in the text view too."""
    for stack in report.stacks:
        main = next((t for t in stack.threads if t.is_main), stack.threads[0] if stack.threads else None)
        if main is None or not main.frames:
            continue
        yield f"rank {stack.rank} stack (main thread, innermost first):"
        for frame in main.frames:
            yield f"   {_frame_text(frame)}"


def render_stacks_brief(report: StacksReport) -> Iterator[str]:
    """The view a model reads: verdict, evidence, the groups on a line each, the next call.

    Written for a reader that pays for every byte and may stop after the first lines, so the
    verdict comes first and nothing is said twice (the human view folds frames instead).
    """
    verdict = report.verdict
    suspects = set(verdict.suspect_ranks)
    yield (
        f"{verdict_label(report)}: {verdict.kind}, confidence {verdict.confidence}"
        + (f"; suspects: {ranks_phrase(verdict.suspect_ranks)}" if verdict.suspect_ranks else "")
    )
    yield verdict.summary
    for item in verdict.evidence:
        if not _said(item, verdict.summary):
            yield f"- {item}"
    yield from _peer_lines(report)
    job = report.job
    here = sorted(r.rank for r in job.ranks if r.rank is not None)
    facts = [f"world {job.world_size or '?'}", f"backend {job.backend}" if job.backend else ""]
    facts.append(f"missing {rank_ranges(job.missing_ranks)}" if job.missing_ranks else "")
    launcher = "" if job.job_id.startswith(f"{job.launcher}:") else f" ({job.launcher})"  # torchrun:host:port
    yield f"job {job.job_id}{launcher}: " + ", ".join(x for x in facts if x)
    if not report.truncated:
        yield f"ranks here: {rank_ranges(here)}"
    for note in job.notes:
        yield f"found: {note.removeprefix(RANKS_CUT)}" if note.startswith(RANKS_CUT) else f"note: {note}"
    waits: dict[int, str | None] = {s.rank: s.wait for s in report.stacks if s.rank is not None}
    seen: set[str] = set()
    said: set[tuple[str | None, str, str]] = set()
    for group in [*report.groups, *report.stack_groups]:
        mark = " <- suspect" if suspects & set(group.ranks) else ""
        if group.state is not None:
            yield f"{ranks_phrase(group.ranks)}: {_STATE_NOTE.get(group.state, group.state)}{mark}"
            continue
        key = (group.op, str(group.call_site), _brief_frames(group, {f.file for f in group.frames}))
        if key in said:  # a whole-stack group that differs only below what this view shows
            continue
        said.add(key)
        what = f"{group.op} at " if group.op else "no collective, at "
        wait = group.wait or _shared_wait(group, waits)
        label = f" [{wait}]" if wait and not (group.op and wait == "collective") else ""
        site = _spelled_once(str(group.call_site), group.call_site.file, seen) if group.call_site else "?"
        yield f"{ranks_phrase(group.ranks)} ({len(group.ranks)}): {what}{site}{label}{mark}"
        outer = _brief_frames(group, seen)
        if outer:
            yield f"   from {outer}"
    yield from _shown_stacks(report)
    for err in report.errors:
        who = f"rank {err.rank}" if err.rank is not None else (err.host or "capture")
        yield f"error: {who}: {err.kind}: {err.message}" + (f" Fix: {err.fix}" if err.fix else "")
    yield from brief_next_steps(verdict.next_steps)
    if report.hint:
        yield f"left out: {report.hint}"  # left_out itself closes every answer (render/answer.py)
