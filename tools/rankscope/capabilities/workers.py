"""Follow a suspect rank into the children it waits on: its DataLoader workers, dumped in the same
call (or the threads that feed the queue it waits on, already in its stack).

A rank named for being "blocked in _BaseDataLoaderIter.__next__" is waiting on a worker; the
worker is where the hang is (a shard that is a FIFO with no writer, a dead NFS mount, a lock).
Discovery already knows each rank's children: each rank whose main thread waits on them has its
children dumped on its own host (py-spy, a bounded number, each within the capture's timeout) and
their kernel waits read (``runtime/kernel_wait.py``), as part of that host's evidence; the workers
that are on data, not waiting for work, become the verdict's evidence for the ranks it names, and
the first of them ends its summary.
"""

from __future__ import annotations

import linecache

from rankscope.analysis.hang.frames import main_thread
from rankscope.analysis.hang.locks import CYCLE_LINE, LOCK_ORDER
from rankscope.analysis.hang.workers import (
    MAX_WORKERS,
    thread_busy,
    unread_worker_line,
    waits_on_children,
    waits_on_threads,
    worker_busy,
    worker_line,
)
from rankscope.errors import DumpFailed
from rankscope.models.core import Frame, Job, NextStep, RankStack, StacksReport
from rankscope.models.look import WorkerLine
from rankscope.options import DumpOptions
from rankscope.runtime import pyspy
from rankscope.runtime.kernel_wait import settled_kernel_wait
from rankscope.runtime.procfs import proc_state


def _worker_frames(pid: int, exe: str, options: DumpOptions) -> list[Frame] | str:
    """The main thread of one child, or why py-spy could not read it: a child in uninterruptible
    sleep (D, a dead NFS mount) is not attached at all (py-spy would wait for it to wake)."""
    if proc_state(pid) == "disk_sleep":
        return "in D state: uninterruptible sleep"
    try:
        threads = pyspy.dump(pid, DumpOptions(timeout=options.timeout), exe)
    except DumpFailed as exc:
        return f"py-spy: {exc.kind}"
    main = next((t.frames for t in threads if t.is_main), threads[0].frames if threads else None)
    return main if main is not None else "py-spy: no thread"


def _source(frames: list[Frame]) -> dict[tuple[str, int], str]:
    """The line each Python frame of a worker is on, read from the files here."""
    out: dict[tuple[str, int], str] = {}
    for f in frames:
        if not f.native and f.line:
            text = linecache.getline(f.file, f.line)
            if text:
                out[(f.file, f.line)] = text.rstrip("\r\n")
    return out


def _thread_lines(stack: RankStack, rank: int) -> list[str]:
    """One line per thread of a rank, besides its main thread, that is busy in the job's own code."""
    lines: list[str] = []
    main = main_thread(stack)
    for thread in stack.threads:
        if thread is main or not thread_busy(thread.frames):
            continue
        tid = thread.os_thread_id
        wait = settled_kernel_wait(stack.pid, tid)
        who = f"thread {thread.name}" if thread.name else "thread"
        lines.append(worker_line(rank, tid or stack.pid, thread.frames, wait, _source(thread.frames), who))
    return lines


def _children_lines(rank: int, children: list[int], exe: str, options: DumpOptions) -> list[str]:
    """One line per busy child of ``children``: each dumped (py-spy) after its kernel wait is read
    (its syscall restarts once the dump stops it)."""
    lines: list[str] = []
    for pid in children:
        wait = settled_kernel_wait(pid)
        frames = _worker_frames(pid, exe, options)
        if isinstance(frames, str):
            line = unread_worker_line(rank, pid, frames, wait)
            lines.extend([line] if line else [])
        elif frames and worker_busy(frames):
            lines.append(worker_line(rank, pid, frames, wait, _source(frames)))
    return lines


def worker_notes(job: Job, stacks: list[RankStack], exe: str, options: DumpOptions) -> list[WorkerLine]:
    """The busy children of each rank whose main thread waits on them (a DataLoader's next batch),
    and the busy threads of each rank that waits on a queue or event of its own: one line each.

    Part of a host's evidence, read before any verdict (on the rank's own host, where the children
    are): the verdict quotes the lines of the ranks it names. At most :data:`MAX_WORKERS` children
    are dumped per call, over every rank, so the call stays short when many ranks wait on data.
    """
    children = {r.pid: r.children for r in job.ranks}
    notes: list[WorkerLine] = []
    dumped = 0
    for stack in sorted(stacks, key=lambda s: (s.rank is None, s.rank or 0)):
        thread = main_thread(stack)
        if stack.rank is None or thread is None:
            continue
        lines = _thread_lines(stack, stack.rank) if waits_on_threads(thread.frames) else []
        kids = (children.get(stack.pid) or [])[: MAX_WORKERS - dumped]
        if kids and waits_on_children(thread.frames):
            lines += _children_lines(stack.rank, kids, exe, options)
            dumped += len(kids)
        notes.extend(WorkerLine(rank=stack.rank, text=line) for line in lines)
    return notes


WORKER_STEP = NextStep(
    action="Fix what the worker (or thread) the evidence names waits on, at its line: the rank only waits "
    "for it (a FIFO needs a writer, a mount must answer, a lock its holder); bound the wait "
    "(DataLoader(timeout=...), a queue get with a timeout) so it raises instead of hanging.",
    skill_section="skill/hangs.md#divergent-ranks",
)
"""The first step once a suspect's worker is found: its wait, not the rank's collective, is the fix."""


def with_workers(report: StacksReport, notes: list[WorkerLine]) -> StacksReport:
    """The report with its suspects' busy DataLoader workers (or threads) as evidence, the first one
    in the summary, and the step that points at its wait first; the other ranks' lines are left out."""
    lines = [n.text for rank in report.verdict.suspect_ranks for n in notes if n.rank == rank]
    if not lines:
        return report
    v = report.verdict
    if LOCK_ORDER in v.summary:  # the cycle says what the threads wait for: their kernel waits back it
        cycle = max((i + 1 for i, e in enumerate(v.evidence) if CYCLE_LINE.match(e)), default=0)
        evidence = [*v.evidence[:cycle], *lines, *v.evidence[cycle:]]
        return report.model_copy(update={"verdict": v.model_copy(update={"evidence": evidence})})
    verdict = v.model_copy(
        update={
            "summary": f"{v.summary}; {lines[0]}",
            "evidence": [*lines, *v.evidence],
            "next_steps": [WORKER_STEP, *v.next_steps],
        }
    )
    return report.model_copy(update={"verdict": verdict})


__all__ = ["with_workers", "worker_notes"]
