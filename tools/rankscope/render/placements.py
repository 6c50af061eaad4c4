"""Lines for a person: the text view of `rankscope placements` (typed on its model; pure)."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.models.placements import PlacementsReport

MAX_LISTED = 40


def render_placements(report: PlacementsReport) -> Iterator[str]:
    yield report.summary
    for t in report.tensors[:MAX_LISTED]:
        how = ",".join(t.placements) if t.placements else f"{len(t.chunks)} chunks"
        yield f"  {t.layout:<8} {t.fqn} {t.global_shape} {t.dtype or ''} ({how})"
    if len(report.tensors) > MAX_LISTED:
        yield f"  ... {len(report.tensors) - MAX_LISTED} more tensors (--json lists all, with chunks)"
    for f in report.files:
        if report.source == "dcp":
            yield f"  file {f.file}: {f.bytes} bytes"
        else:
            yield f"  {f.file}: ~{f.bytes} bytes of parameters on that rank"
    if report.coverage is not None:
        c = report.coverage
        yield (
            f"coverage: {c.sharded_share:.0%} sharded, {c.replicated_share:.0%} replicated, {c.plain_share:.0%} plain; "
            f"per rank ~{c.est_param_bytes_per_rank} B params, {c.est_grad_bytes_per_rank} B grads, "
            f"{c.est_adam_state_bytes_per_rank} B Adam state"
        )
        for w in c.warnings:
            yield f"warning: {w}"
    for p in report.problems:
        yield f"problem: {p}"
