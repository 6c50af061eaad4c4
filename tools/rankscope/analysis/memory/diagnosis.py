"""The one memory finding of a set of snapshots: which rank, which site, how much, and the pattern.

Snapshots of several ranks, and of one rank at several moments, say more together than each alone:
a site whose live blocks grow from one snapshot of a rank to the next, or whose trace frees every
allocation but every Nth, leaks, and its fix is to stop keeping the tensors, not to shard more; one
rank far above the others does work the others do not; every rank near the same peak at an OOM is
a plan that cannot fit; fragmentation is named only when the numbers at the failure say so. The
patterns are tried in that order (a leak explains an imbalance and an exhaustion; the numbers of a
fragmented failure outrank a plan that looks tight).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rankscope.analysis.memory.frames import SKILL
from rankscope.analysis.memory.graph import KeptGraph, kept_graphs
from rankscope.analysis.memory.imbalance import imbalance
from rankscope.analysis.memory.keeper import keeper_words
from rankscope.analysis.memory.snapshot import LEAK_FIX, ordinal
from rankscope.analysis.units import MiB, fmt_bytes
from rankscope.models.core import Finding, NextStep
from rankscope.models.memory import AllocationSite, SnapshotSummary

LEAK_MIN = 256 * MiB
"""The least a site must grow, or keep, to lead the answer as a leak."""
NEAR = 0.9
"""Every rank's peak at least this share of the highest: the plan itself is at the limit."""


@dataclass
class _Leak:
    """A leaking site of one rank, with what says so."""

    rank: int | None
    site: str
    script: str | None  # with its caller (train.py:40 in evaluate <- train.py:95 in main)
    live_bytes: int
    blocks: int
    kept_every: int | None = None
    signs: list[str] = field(default_factory=list)

    @property
    def place(self) -> tuple[str, str | None]:
        return self.site, self.script


def _ordered(summaries: Sequence[SnapshotSummary]) -> dict[int | None, list[SnapshotSummary]]:
    """Snapshots per rank, oldest first (by the time of their trace's last entry, else as given)."""
    by_rank: dict[int | None, list[SnapshotSummary]] = {}
    for s in summaries:
        by_rank.setdefault(s.rank, []).append(s)
    for snaps in by_rank.values():
        snaps.sort(key=_moment)
    return by_rank


def _moment(s: SnapshotSummary) -> tuple[bool, int, bool]:
    """When a snapshot was taken, as far as it says: one at an OOM is a rank's last (the rank died
    there), then by its trace's last time, then a name that says OOM (a snapshot without a trace)."""
    return bool(s.ooms), s.end_time_us or 0, "oom" in s.source.rsplit("/", 1)[-1].lower()


def _site(s: SnapshotSummary, place: tuple[str, str | None]) -> AllocationSite | None:
    """The snapshot's top site at a place: the same library line, reached from the same script line."""
    return next((t for t in s.top_sites if (t.site, t.script) == place), None)


def _label(s: SnapshotSummary) -> str:
    return "at the OOM" if s.ooms else f"in {s.source.rsplit('/', 1)[-1]}"


def _leaks(by_rank: dict[int | None, list[SnapshotSummary]]) -> list[_Leak]:
    """Leaking sites: kept every Nth in a trace, growing over a trace, or growing from one snapshot to the next.

    A site leads only with bytes that matter to its rank: LEAK_MIN, or a twentieth of the rank's
    peak when that is less (a few kept tensors of a small job), so a small tensor kept for a log
    line does not hide a plan that cannot fit.
    """
    found: dict[tuple[int | None, tuple[str, str | None]], _Leak] = {}
    for rank, snaps in by_rank.items():
        least = min(LEAK_MIN, max(s.peak_allocated_bytes for s in snaps) // 20)
        _trace_leaks(rank, snaps, found, least)
        _growth_leaks(rank, snaps, found, least)
    return sorted(found.values(), key=lambda lk: (-len(lk.signs), -lk.live_bytes))


def _trace_leaks(
    rank: int | None,
    snaps: list[SnapshotSummary],
    found: dict[tuple[int | None, tuple[str, str | None]], _Leak],
    least: int,
) -> None:
    """The leak suspects of the rank's traces, the latest trace first (it says it best)."""
    last = snaps[-1]
    for s in reversed(snaps):
        for sus in s.leak_suspects:
            place = (sus.site, sus.script)
            held = _site(last, place)
            live = held.live_bytes if held else sus.end_bytes
            if (sus.growth_bytes if sus.kept_every is None else live) < least:
                continue
            leak = found.setdefault(
                (rank, place),
                _Leak(rank, *place, live, held.blocks if held else sus.kept),
            )
            if sus.kept_every and leak.kept_every is None:
                leak.kept_every = sus.kept_every
                leak.signs.append(
                    f"the trace {_label(s)} {_kept_phrase(sus.kept_every, sus.kept, sus.allocs)}"
                )
            elif not sus.kept_every and not leak.signs:
                leak.signs.append(f"its live bytes only grew over the trace {_label(s)}")


def _growth_leaks(
    rank: int | None,
    snaps: list[SnapshotSummary],
    found: dict[tuple[int | None, tuple[str, str | None]], _Leak],
    least: int,
) -> None:
    """Places holding more bytes in more blocks in the rank's latest snapshot than in its first."""
    if len(snaps) < 2:
        return
    for site in snaps[-1].top_sites:
        place = (site.site, site.script)
        before = _site(snaps[0], place)
        b_bytes, b_blocks = (before.live_bytes, before.blocks) if before else (0, 0)
        if site.live_bytes - b_bytes < least or site.blocks <= b_blocks:
            continue
        leak = found.setdefault((rank, place), _Leak(rank, *place, site.live_bytes, site.blocks))
        leak.signs.insert(0, f"it held {fmt_bytes(b_bytes)} in {b_blocks} blocks {_label(snaps[0])}")


def _elsewhere(by_rank: dict[int | None, list[SnapshotSummary]], leak: _Leak) -> tuple[str, list[int]]:
    """What the other ranks' latest snapshots hold at the leak's site, and those that hold as much
    (at least half): a leak in code every rank runs is every rank's, not the first one's."""
    others = {
        r: _site(snaps[-1], leak.place) for r, snaps in by_rank.items() if r != leak.rank and r is not None
    }
    if not others:
        return "", []
    held = {r: t.live_bytes for r, t in others.items() if t is not None and t.live_bytes}
    if not held:
        return "; the other ranks hold none of it", []
    alike = sorted(r for r, b in held.items() if 2 * b >= leak.live_bytes)
    return "; " + ", ".join(f"rank {r} holds {fmt_bytes(b)}" for r, b in sorted(held.items())), alike


def _where(site: str, script: str | None) -> str:
    """A place as one line: the site, the script line that led there and its caller."""
    return site + (f" <- {script}" if script else "")


def _kept_phrase(every: int, kept: int, allocs: int) -> str:
    if every == 1:
        return f"frees none of the {allocs} allocations there"
    return f"frees every allocation there but every {ordinal(every)} ({kept} of {allocs} kept)"


def _finding(
    pattern: str,
    rank: int | None,
    message: str,
    fix: str,
    section: str,
    facts: dict[str, object],
    tool: str | None = None,
    failed: bool = True,
) -> Finding:
    return Finding(
        kind=f"memory_{pattern}",
        severity="error" if failed else "warning",  # without an OOM, what will fail
        ranks=[rank] if rank is not None else [],
        message=message,
        fix=fix,
        source="snapshots",
        facts={"pattern": pattern, "rank": rank, **{k: v for k, v in facts.items() if v is not None}},
        next_steps=[
            NextStep(
                action=f"Read the {pattern.replace('_', ' ')} section.", skill_section=section, tool=tool
            )
        ],
    )


def _who(rank: int | None) -> str:
    return f"rank {rank}" if rank is not None else "this rank"


def _failed(by_rank: dict[int | None, list[SnapshotSummary]]) -> bool:
    return any(s.ooms for snaps in by_rank.values() for s in snaps)


def _kept_graph(leak: _Leak, latest: SnapshotSummary) -> KeptGraph | None:
    """The kept forward of the leak's own call (its script line and caller), if the snapshot shows one."""
    held = ((t.site, t.script, t.live_bytes, t.blocks) for t in latest.top_sites)
    return next((g for g in kept_graphs(held) if leak.script and g.script == leak.script), None)


def _held(leak: _Leak, graph: KeptGraph | None, label: str) -> str:
    """What the leak's place holds: its own blocks, or, when its call keeps whole forwards, the
    outputs and the activations autograd saved with them, the leak's own line among them."""
    if graph is None or leak.script is None:
        return f"{_where(*leak.place)} holds {fmt_bytes(leak.live_bytes)} in {leak.blocks} blocks {label}"
    more = f", +{len(graph.graph_sites) - 1} lines" if len(graph.graph_sites) > 1 else ""
    return (
        f"{leak.script} keeps {graph.calls} outputs ({graph.output_site}) with "
        f"{fmt_bytes(graph.graph_bytes)} of activations in {graph.graph_blocks} blocks ({graph.graph_sites[0]}"
        f"{more}) {label}: their autograd graphs are alive (grad enabled, a kept tensor still attached)"
    )


def _leak_finding(
    leaks: list[_Leak], by_rank: dict[int | None, list[SnapshotSummary]], sources: Mapping[str, str]
) -> Finding:
    leak = leaks[0]
    elsewhere, alike = _elsewhere(by_rank, leak)
    who = _who(leak.rank) + (f" (and {', '.join(map(str, alike))}: every rank runs it)" if alike else "")
    every = (
        f"every {ordinal(leak.kept_every)} tensor"
        if leak.kept_every and leak.kept_every > 1
        else "the tensors"
    )
    latest = by_rank[leak.rank][-1]
    graph = _kept_graph(leak, latest)
    words = keeper_words(leak.site, leak.script, sources, graph=graph is not None, every=every)
    message = (
        f"Leak on {who}: {_held(leak, graph, _label(latest))}; "
        + (f"at {leak.site}: " if graph else "")
        + "; ".join(leak.signs)
        + elsewhere
        + words.kept
    )
    made = leak.script or ""
    func = made.split(" <- ")[0].rpartition(" in ")[2]
    fix = words.fix or (
        f"Run {func} ({made}) under torch.no_grad() and keep only `.detach().cpu()` copies of what it "
        "computes: its kept outputs hold their autograd graphs."
        if graph is not None and func
        else f"Stop keeping {every} from {leak.site}"
        + (f" (made at {made})" if made else "")
        + f". {LEAK_FIX}"
    )
    found = _finding(
        "leak",
        leak.rank,
        message,
        fix,
        f"{SKILL}#leak",
        {
            "site": leak.site,
            "script": leak.script.split(" <- ")[0] if leak.script else None,
            "caller": leak.script.split(" <- ")[1] if leak.script and " <- " in leak.script else None,
            "live_bytes": leak.live_bytes,
            "blocks": leak.blocks,
            "kept_every": leak.kept_every,
            "keeps": words.quotes or None,
            "graph_bytes": graph.graph_bytes if graph is not None else None,
        },
        failed=_failed(by_rank),
    )
    found.ranks = sorted({*found.ranks, *alike})
    return found


def _rank_only(by_rank: dict[int | None, list[SnapshotSummary]]) -> Finding | None:
    """One rank's peak far above the others': the site it holds that the others hold least of."""
    peaks = {r: max(s.peak_allocated_bytes for s in snaps) for r, snaps in by_rank.items() if r is not None}
    flagged = imbalance(peaks)
    if not flagged:
        return None
    rank, value, base = flagged[0]
    last = by_rank[rank][-1]

    def extra(t: AllocationSite) -> int:
        others = [
            (
                _site(snaps[-1], (t.site, t.script)) or AllocationSite(site="", live_bytes=0, blocks=0)
            ).live_bytes
            for r, snaps in by_rank.items()
            if r != rank and r is not None
        ]
        return t.live_bytes - int(statistics.median(others)) if others else t.live_bytes

    top = max(last.top_sites, key=extra, default=None)
    at = f": most of it at {_where(top.site, top.script)} ({fmt_bytes(top.live_bytes)})" if top else ""
    return _finding(
        "rank_only",
        rank,
        f"Rank {rank} peaks at {fmt_bytes(value)}, {fmt_bytes(value - base)} above the other ranks' "
        f"median of {fmt_bytes(base)}{at}",
        "Look at what this rank does that the others do not there (`if rank == 0` logging or eval, a "
        "full state_dict gathered to one rank, longer inputs); move it off the training GPU or spread it.",
        f"{SKILL}#imbalance",
        {
            "site": top.site if top else None,
            "script": top.script if top else None,
            "peak_bytes": value,
            "others_median_bytes": base,
        },
        failed=_failed(by_rank),
    )


def _at_oom(by_rank: dict[int | None, list[SnapshotSummary]]) -> Finding | None:
    """An OOM that no leak or rank explains: fragmentation by its numbers, else a plan at the limit."""
    failed = [s for snaps in by_rank.values() for s in snaps if s.ooms]
    if not failed:
        return None
    s = failed[-1]
    frag = s.fragmentation
    if frag.kind == "fragmentation":
        fix = "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of splitting)."
        if s.expandable_segments:
            fix = "expandable_segments is already on: pad sizes to a few buckets or free large temporaries earlier."
        return _finding(
            "fragmentation",
            s.rank,
            f"OOM from fragmentation on {_who(s.rank)}: {frag.explanation}",
            fix,
            f"{SKILL}#fragmentation",
            {
                "failed_request_bytes": frag.failed_request_bytes,
                "reserved_bytes": frag.reserved_bytes,
                "allocated_bytes": frag.allocated_bytes,
            },
        )
    oom = s.ooms[-1]
    if oom.device_free_bytes is not None and oom.requested_bytes > s.reserved_bytes + oom.device_free_bytes:
        return _finding(  # no plan helps: one tensor larger than the whole device
            "exhaustion",
            s.rank,
            f"One request of {fmt_bytes(oom.requested_bytes)} on {_who(s.rank)} exceeds all the GPU memory "
            f"PyTorch could have ({fmt_bytes(s.reserved_bytes)} reserved + {fmt_bytes(oom.device_free_bytes)} "
            f"free)" + (f", at {oom.site}" if oom.site else ""),
            "Check the shape of the tensor allocated there (a wrong size, a missing batch split, an outer "
            "product where a reduction was meant); sharding cannot make one tensor fit.",
            f"{SKILL}#exhaustion",
            {"failed_request_bytes": oom.requested_bytes, "site": oom.site},
        )
    peaks = [max(x.peak_allocated_bytes for x in snaps) for r, snaps in by_rank.items() if r is not None]
    top = s.top_sites[0] if s.top_sites else None
    holder = (
        f"; the largest holder is {_where(top.site, top.script)} ({fmt_bytes(top.live_bytes)})" if top else ""
    )
    facts: dict[str, object] = {
        "failed_request_bytes": frag.failed_request_bytes,
        "site": top.site if top else None,
    }
    if len(peaks) >= 2 and min(peaks) >= NEAR * max(peaks):
        return _finding(
            "cannot_fit",
            s.rank,
            f"The plan cannot fit: every one of {len(peaks)} ranks peaks near {fmt_bytes(max(peaks))} and the "
            f"OOM is real exhaustion{holder}",
            "Check the plan with memory_budget, then hold less per rank: shard per block, activation "
            "checkpointing, a smaller micro-batch.",
            f"{SKILL}#budget",
            facts,
            tool="memory_budget",
        )
    if len(peaks) >= 2:
        fix = (
            f"Hold less at once on every rank (peaks {fmt_bytes(min(peaks))} to {fmt_bytes(max(peaks))}): "
            "activation checkpointing, a smaller micro-batch; check the plan with memory_budget."
        )
    else:
        fix = (
            "Hold less at once (activation checkpointing, smaller micro-batch); take a snapshot of another rank "
            "too: all ranks near the limit is a plan that cannot fit (memory_budget), one rank above is "
            "rank-only work."
        )
    return _finding(
        "exhaustion",
        s.rank,
        f"OOM from real exhaustion on {_who(s.rank)}{holder}",
        fix,
        f"{SKILL}#exhaustion",
        facts,
    )


def diagnose(
    summaries: Sequence[SnapshotSummary], sources: Mapping[str, str] | None = None
) -> Finding | None:
    """The one memory finding that leads an answer about these snapshots (None when they show nothing wrong).

    ``sources``: the text of the job's files the places name, by the path the frames give (the
    shell finds them on this host or beside the snapshots): a leak's answer then quotes the
    statements that keep its tensors, and its fix names them.
    """
    by_rank = _ordered(summaries)
    leaks = _leaks(by_rank)
    if leaks:
        return _leak_finding(leaks, by_rank, sources or {})
    failed = any(s.ooms for s in summaries)
    if failed:
        frag = _at_oom(by_rank)
        if frag is not None and frag.kind == "memory_fragmentation":
            return frag
    return _rank_only(by_rank) or (_at_oom(by_rank) if failed else None)
