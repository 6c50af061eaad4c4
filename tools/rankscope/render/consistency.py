"""Lines for a person: the text view of `rankscope compare` (typed on its model; pure).

The cause the comparison can see comes first, naming the rank; then the verdict, the other causes,
the few tensors that show it, and the next call. The rest is in --json (MCP: the structured content).
"""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.models.consistency import ConsistencyReport
from rankscope.render.next_steps import render_next_steps

MAX_LISTED = 8
"""Divergent tensors listed (and as many NaN/Inf and key lines); the first 3 with each rank's values.
Half as many, and one with its values, when a cause leads: the tensors are then its evidence only."""
WITH_VALUES = 3
MAX_CAUSES = 4


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def render_consistency(report: ConsistencyReport) -> Iterator[str]:
    if report.causes:
        yield report.causes[0]
    yield ("CONSISTENT: " if report.consistent else "INCONSISTENT: ") + report.summary
    for cause in report.causes[1:MAX_CAUSES]:
        yield f"  also: {cause}"
    listed, with_values = (MAX_LISTED, WITH_VALUES) if not report.causes else (MAX_LISTED // 2, 1)
    for i, d in enumerate(report.divergent[:listed]):
        tie = " (tie: no majority)" if d.tie else ""
        where = f" [{d.shard_key}]" if d.shard_key and d.shard_key != "replicated" else ""
        yield f"  {d.name}{where}: ranks {d.ranks} differ from {d.reference_ranks}{tie} ({d.reason})"
        for v in d.values if i < with_values else ():
            diff = f" max|diff|={_fmt(v.max_abs_diff)}" if v.max_abs_diff is not None else ""
            yield f"      rank {v.rank}: shape={v.shape} dtype={v.dtype} sum={_fmt(v.sum)} absmax={_fmt(v.abs_max)}{diff}"
    if len(report.divergent) > listed:
        yield f"  ... {len(report.divergent) - listed} more divergent tensors (--json or full=true lists all)"
    for n in report.nonfinite[:MAX_LISTED]:
        yield f"  NaN/Inf: {n.name} on rank {n.rank} (nan={n.nan}, inf={n.inf})"
    for k in report.missing_keys[:MAX_LISTED]:
        yield f"  only on ranks {k.present_on}: {k.name} (missing on {k.missing_on})"
    for name in report.partial[:MAX_LISTED]:
        yield f"  Partial (unreduced) DTensor: {name}"
    if report.per_rank:
        yield f"  each rank its own, by design (not counted): {', '.join(report.per_rank[:MAX_LISTED])}"
    if report.read:
        yield "read: " + "; ".join(report.read)
    for p in report.problems:
        yield f"problem: {p}"
    yield from render_next_steps(report.next_steps)
