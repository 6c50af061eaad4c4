"""Findings of rankscope.probe.memory_report, gathered from every rank inside the job."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rankscope.analysis.memory.frames import SKILL
from rankscope.analysis.memory.imbalance import imbalance, imbalance_finding
from rankscope.models.core import Finding, NextStep
from rankscope.models.memory import (
    MemoryProbeReport,
    RankMemoryStats,
)

# ------------------------------------------------------------------ probe


def probe_findings(stats: Iterable[RankMemoryStats]) -> list[Finding]:
    """Imbalance and allocator-retry findings for ``memory_report()``."""
    stats = list(stats)
    out: list[Finding] = []
    peaks = {s.rank: s.peak_allocated_bytes for s in stats if s.peak_allocated_bytes is not None}
    what = "peak allocated CUDA memory"
    if not peaks:
        peaks = {s.rank: s.rss_bytes for s in stats if s.rss_bytes is not None}
        what = "host RSS"
    flagged = imbalance({k: v for k, v in peaks.items() if v is not None})
    if flagged:
        out.append(imbalance_finding(what, flagged, "memory_report"))
    retries = [s.rank for s in stats if s.alloc_retries]
    if retries:
        out.append(
            Finding(
                kind="allocator_retries",
                severity="warning",
                ranks=retries,
                message="the CUDA caching allocator had to free its cache and retry cudaMalloc",
                explanation="num_alloc_retries > 0 means allocations only succeeded after flushing the cache: "
                "memory is near the limit or fragmented.",
                fix="Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; record snapshots with "
                "rankscope.probe.record_oom_snapshots(dir).",
                facts={str(s.rank): s.alloc_retries for s in stats if s.alloc_retries},
                next_steps=[
                    NextStep(action="Read the fragmentation section.", skill_section=f"{SKILL}#fragmentation")
                ],
            )
        )
    return out


def probe_report(stats: Sequence[RankMemoryStats], world_size: int, gathered: bool) -> MemoryProbeReport:
    return MemoryProbeReport(
        world_size=world_size,
        gathered=gathered,
        ranks=sorted(stats, key=lambda s: s.rank),
        findings=probe_findings(stats),
    )
