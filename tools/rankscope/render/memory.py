"""Lines for a person: the text view of `rankscope memory` (typed on its model; pure)."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.analysis.memory.snapshot import ordinal
from rankscope.analysis.units import fmt_bytes
from rankscope.models.memory import BudgetReport, MemoryReport


def render_memory(report: MemoryReport) -> Iterator[str]:
    if report.mode == "live":
        job = report.job
        yield f"job {job.job_id if job else '?'}: {len(report.ranks)} rank(s) on this host"
        if report.gpu_note:
            yield f"GPU: {report.gpu_note}"
        yield f"{'rank':>5} {'pid':>8} {'gpu':>10} {'rss':>10} {'peak rss':>10} {'shmem':>10} {'workers':>8} {'workers pss':>12}"
        for r in report.ranks:
            rank = "?" if r.rank is None else str(r.rank)
            yield (
                f"{rank:>5} {r.pid:>8} {fmt_bytes(r.gpu_used_bytes) if r.gpu_used_bytes is not None else '-':>10} "
                f"{fmt_bytes(r.rss_bytes):>10} {fmt_bytes(r.peak_rss_bytes):>10} {fmt_bytes(r.shmem_bytes):>10} {r.children:>8} "
                f"{fmt_bytes(r.children_pss_bytes or r.children_rss_bytes):>12}"
                + (f"  ({r.error})" if r.error else "")
            )
    for s in report.snapshots:
        rank = "" if s.rank is None else f" (rank {s.rank})"
        yield f"{s.source}{rank}"
        yield (
            f"  allocated {fmt_bytes(s.allocated_bytes)} / reserved {fmt_bytes(s.reserved_bytes)} at the end; "
            f"peak allocated {fmt_bytes(s.peak_allocated_bytes)}, peak reserved {fmt_bytes(s.peak_reserved_bytes)} "
            f"({s.trace_events} trace events)"
        )
        yield f"  {s.fragmentation.kind}: {s.fragmentation.explanation}"
        for site in s.top_sites:
            script = f" <- {site.script}" if site.script else ""
            yield f"  {fmt_bytes(site.live_bytes):>10}  {site.blocks:>5} blocks  {site.site}{script}"
        if s.other_sites:
            yield f"  {fmt_bytes(s.other_sites_bytes):>10}  in {s.other_sites} other site(s)"
        for leak in s.leak_suspects:
            every = f", every {ordinal(leak.kept_every)} kept" if leak.kept_every else ""
            every = ", none freed" if leak.kept_every == 1 else every
            script = f" <- {leak.script}" if leak.script else ""
            yield (
                f"  leak suspect: {leak.site}{script} +{fmt_bytes(leak.growth_bytes)} "
                f"({leak.allocs} allocs, {leak.frees} frees{every})"
            )
    for f in report.findings:
        ranks = f" [ranks {', '.join(map(str, f.ranks))}]" if f.ranks else ""
        yield f"{f.severity}: {f.kind}{ranks}: {f.message}"
        if f.fix:
            yield f"  fix: {f.fix}"
    for e in report.errors:
        yield f"error (rank {e.rank}): {e.message}"
    if report.hint:
        yield report.hint


def render_budget(b: BudgetReport) -> Iterator[str]:
    yield (
        f"{b.total_params:,} parameters, world size {b.world_size}, {b.optimizer} "
        f"({b.optimizer_states:g} states/element), params {b.param_dtype}, grads {b.grad_dtype}, states {b.optim_dtype}"
    )
    if b.gpu_memory_bytes is not None:
        yield f"GPU memory: {fmt_bytes(b.gpu_memory_bytes)}"
    yield f"{'plan':<16} {'units':>5} {'params':>10} {'grads':>10} {'optim':>10} {'all-gather':>11} {'total':>10} {'fits':>5}"
    for p in b.plans:
        fits = "-" if p.fits is None else ("yes" if p.fits else "NO")
        yield (
            f"{p.plan:<16} {p.units:>5} {fmt_bytes(p.params_bytes):>10} {fmt_bytes(p.grads_bytes):>10} "
            f"{fmt_bytes(p.optimizer_bytes):>10} {fmt_bytes(p.allgather_peak_bytes):>11} {fmt_bytes(p.total_bytes):>10} {fits:>5}"
        )
    if b.recommended:
        yield f"recommended: {b.recommended}"
    for f in b.findings:
        yield f"{f.severity}: {f.kind}: {f.message}" + (f"\n  fix: {f.fix}" if f.fix else "")
    for n in b.notes:
        yield f"note: {n}"
