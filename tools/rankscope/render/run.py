"""Lines for a person: the text view of `rankscope run` (typed on its model; pure)."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.models.core import StacksReport
from rankscope.models.run import RunReport
from rankscope.render.next_steps import render_next_steps


def _render_stacks(stacks: StacksReport) -> Iterator[str]:
    from rankscope.analysis.collapse import rank_label

    v = stacks.verdict
    suspects = f" (suspect ranks: {', '.join(map(str, v.suspect_ranks))})" if v.suspect_ranks else ""
    yield f"verdict: {v.kind}{suspects}"
    yield f"  {v.summary}"
    for line in v.evidence:
        yield f"  - {line}"
    for group in stacks.groups:
        where = f" at {group.call_site}" if group.call_site else ""
        op = group.op or (f"state {group.state}" if group.state else "no collective")
        yield f"  {rank_label(group.ranks) if group.ranks else 'no ranks'}: {op}{where}"
        for frame in group.frames[:8]:
            yield f"      {frame.function} ({frame.where()})"
    for err in stacks.errors:
        yield f"  capture error on rank {err.rank} (pid {err.pid}): {err.message}"
    yield from render_next_steps(v.next_steps, indent="  ")


def render_run(report: RunReport) -> Iterator[str]:
    """The end-of-run summary printed after the streamed output."""
    from rankscope.analysis.collapse import render_collapsed

    yield ""
    yield f"== rankscope run: {report.outcome} =="
    if report.collapsed_stdout:
        yield "-- stdout, all ranks (identical lines collapsed; '!' = not the same on every rank) --"
        yield from render_collapsed(report.collapsed_stdout)
    if report.collapsed_stderr:
        yield "-- stderr, all ranks --"
        yield from render_collapsed(report.collapsed_stderr)
    for e in report.failed_ranks:
        how = e.signal or f"exit code {e.exit_code}"
        first = " (first failure)" if e.root_cause else ""
        detail = f": {e.detail}" if e.detail and not e.detail.startswith("Signal ") else ""
        yield f"rank {e.rank}: {how}{first}{detail}"
    if report.outcome == "hung" and report.hang_evidence:
        yield f"hang: {report.hang_evidence}"
    if report.stacks is not None:
        yield from _render_stacks(report.stacks)
    for note in report.notes:
        yield f"note: {note}"
    yield report.summary
    shown = report.stacks.verdict.next_steps if report.stacks is not None else []
    yield from render_next_steps([s for s in report.next_steps if s not in shown])
