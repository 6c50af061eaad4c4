"""Memory across ranks (imbalance, live and from snapshots) and the /proc and nvidia-smi text it is read from."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from rankscope.analysis.memory.frames import SKILL
from rankscope.analysis.units import MiB, fmt_bytes
from rankscope.models.core import Finding, NextStep
from rankscope.models.memory import (
    RankMemory,
    SnapshotSummary,
)

# --------------------------------------------------------------- imbalance


def imbalance(
    values: Mapping[int, int], *, rel: float = 0.25, min_abs: int = 256 * MiB
) -> list[tuple[int, int, int]]:
    """Ranks far above the others: (rank, value, median of the other ranks).

    Compared against the median of the *other* ranks so that with two ranks
    the heavy one still stands out against the light one.
    """
    if len(values) < 2:
        return []
    out: list[tuple[int, int, int]] = []
    for rank, value in values.items():
        others = [v for r, v in values.items() if r != rank]
        base = int(statistics.median(others))
        if value - base >= max(min_abs, rel * base):
            out.append((rank, value, base))
    out.sort(key=lambda t: t[1] - t[2], reverse=True)
    return out


def imbalance_finding(what: str, flagged: list[tuple[int, int, int]], source: str | None) -> Finding:
    rank, value, base = flagged[0]
    return Finding(
        kind="rank_memory_imbalance",
        severity="warning",
        ranks=[r for r, _, _ in flagged],
        message=(
            f"rank {rank} uses {fmt_bytes(value)} of {what}, {fmt_bytes(value - base)} above the other ranks' "
            f"median of {fmt_bytes(base)}"
        ),
        explanation=(
            "One rank far above the others points at work done on one rank only (rank-0 logging, eval, "
            "checkpoint gathering to rank 0), uneven inputs (longer sequences on that rank), or a leak on that rank."
        ),
        fix=(
            "Look at what this rank does differently (`if rank == 0` blocks, full state_dict gathers, "
            "per-rank data lengths); on CUDA take snapshots of this rank and one other and compare top sites."
        ),
        source=source,
        facts={"what": what, "ranks": {str(r): {"bytes": v, "others_median": b} for r, v, b in flagged}},
        next_steps=[NextStep(action="Read the imbalance section.", skill_section=f"{SKILL}#imbalance")],
    )


def live_findings(ranks: Sequence[RankMemory], *, min_abs: int = 256 * MiB) -> list[Finding]:
    """Imbalance across ranks of GPU memory, host RSS, and DataLoader worker memory."""
    out: list[Finding] = []
    checks: list[tuple[str, dict[int, int]]] = [
        (
            "GPU memory",
            {r.rank: r.gpu_used_bytes for r in ranks if r.rank is not None and r.gpu_used_bytes is not None},
        ),
        ("host RSS", {r.rank: r.rss_bytes for r in ranks if r.rank is not None and r.rss_bytes is not None}),
        (
            "DataLoader-worker RSS",
            {
                r.rank: r.children_pss_bytes or r.children_rss_bytes
                for r in ranks
                if r.rank is not None and r.children
            },
        ),
    ]
    for what, values in checks:
        flagged = imbalance(values, min_abs=min_abs)
        if flagged:
            out.append(imbalance_finding(what, flagged, None))
    return out


def compare_snapshots(summaries: Sequence[SnapshotSummary], *, min_abs: int = 256 * MiB) -> list[Finding]:
    """One rank's peak far above the other ranks' (snapshot files of several ranks)."""
    peaks = {s.rank: s.peak_allocated_bytes for s in summaries if s.rank is not None}
    flagged = imbalance(peaks, min_abs=min_abs)
    return [imbalance_finding("peak allocated CUDA memory", flagged, "snapshots")] if flagged else []


# ------------------------------------------------------------ /proc parsing


def parse_kb_fields(text: str) -> dict[str, int]:
    """'VmRSS:   1234 kB' lines (/proc/PID/status, smaps_rollup) to bytes by field name."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) >= 2 and parts[1] == "kB" and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * 1024
    return out


def parse_nvidia_smi_apps(text: str) -> dict[int, list[tuple[str, int]]]:
    """``--query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits`` to pid -> [(gpu, bytes)]."""
    out: dict[int, list[tuple[str, int]]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        try:
            mib = int(float(parts[1]))
        except ValueError:
            continue  # "[N/A]" / "[Not Supported]"
        gpu = parts[2] if len(parts) > 2 else ""
        out.setdefault(int(parts[0]), []).append((gpu, mib * MiB))
    return out
