"""One CUDA memory snapshot: peak, fragmentation, OOMs, top allocation sites and leak suspects."""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankscope.analysis.memory.frames import (
    NO_FRAMES,
    SKILL,
    SMALL_POOL_MAX,
    BlockExtra,
    FrameFilter,
    SiteNamer,
    block_extra_fallback,
    frame_filter_fallback,
)
from rankscope.analysis.memory.graph import kept_graphs
from rankscope.analysis.units import MiB, fmt_bytes
from rankscope.models.core import Finding, NextStep
from rankscope.models.memory import (
    AllocationSite,
    Fragmentation,
    LeakSuspect,
    OomEvent,
    SnapshotSummary,
)

# --------------------------------------------------------------- snapshots

_RANK_WORD = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_RANK_SHORT = re.compile(r"(?:^|[_.-])r(\d+)(?:$|[_.-])", re.IGNORECASE)
_LAST_INT = re.compile(r"(\d+)(?!.*\d)")


def rank_from_filename(name: str, *, loose: bool = False) -> int | None:
    """Rank from a file name: 'snapshot-rank3.pickle', 'oom_rank_3.pkl', 'mem_r3.pickle'.

    ``loose`` (files of one directory) also accepts a bare number ('3.pickle',
    'snapshot_3.pickle'); a lone file's number may be a pid or a step, so not.
    """
    stem = name.rsplit("/", 1)[-1].split(".", 1)[0]
    m = _RANK_WORD.search(stem) or _RANK_SHORT.search(stem)
    if m is None and loose:
        m = _LAST_INT.search(stem)
    return int(m.group(1)) if m else None


def _seg_device(seg: Mapping[str, Any]) -> int:
    return int(seg.get("device", 0) or 0)


def _sample_ends(n: int, windows: int) -> list[int]:
    """Indices of the trace entries after which a window of per-site live bytes is sampled.

    ``windows`` equal slices, each ending at ``n * (w + 1) // windows - 1``; a
    trace shorter than ``windows`` (a negative first end) is not sampled.
    """
    ends = [min(n - 1, (n * (w + 1)) // windows - 1) for w in range(windows)] if n else []
    if not ends or ends[0] < 0:
        return []
    return sorted(set(ends))


@dataclass
class _EndState:
    """What the segments say about the end of the snapshot, per device."""

    end_alloc: dict[int, int] = field(default_factory=dict)
    end_res: dict[int, int] = field(default_factory=dict)
    pending: int = 0
    active: list[Mapping[str, Any]] = field(default_factory=list)  # active_allocated blocks
    free_by_dev: dict[int, list[tuple[int, str]]] = field(default_factory=dict)  # device -> [(size, type)]
    pending_by_dev: dict[int, int] = field(default_factory=dict)
    expandable: bool | None = None


def _read_segments(segments: Sequence[Mapping[str, Any]]) -> _EndState:
    """One pass over the segments: allocated, reserved, pending-free and free blocks per device."""
    st = _EndState()
    for seg in segments:
        dev = _seg_device(seg)
        st.end_res[dev] = st.end_res.get(dev, 0) + int(seg.get("total_size", 0))
        if "is_expandable" in seg:
            st.expandable = bool(seg["is_expandable"]) or bool(st.expandable)
        seg_type = str(seg.get("segment_type", "large"))
        for b in seg.get("blocks") or []:
            state = b.get("state")
            size = int(b.get("size", 0))
            if state == "active_allocated":
                st.end_alloc[dev] = st.end_alloc.get(dev, 0) + size
                st.active.append(b)
            elif state == "inactive":
                st.free_by_dev.setdefault(dev, []).append((size, seg_type))
            else:  # active_pending_free / active_awaiting_free: freed, but no free_completed yet
                st.pending += size
                st.pending_by_dev[dev] = st.pending_by_dev.get(dev, 0) + size
    return st


@dataclass
class _Replay:
    """Totals of one forward pass over a device trace, relative to the start of the trace."""

    alloc_now: int = 0
    res_now: int = 0
    peak_alloc: int = 0
    peak_res: int = 0
    peak_idx: int | None = None
    samples: list[dict[int, int]] = field(default_factory=list)  # per window: site id -> live bytes
    oom_entries: list[Mapping[str, Any]] = field(default_factory=list)


def _replay_trace(trace: Sequence[Mapping[str, Any]], windows: int, namer: SiteNamer) -> _Replay:
    """The hot loop: replay the totals and their peaks, sample live bytes per site at the window ends.

    Per entry it only replays the totals and keeps the live in-trace allocations (address ->
    alloc entry); sites are named at the window ends, for the allocations live there (a few
    thousand), not for each of the millions of entries. Inconsistent traces keep their bytes
    where a per-site running sum would: an alloc over a live address leaves the old one counted
    for good, and a free of another size than its alloc leaves the difference.
    """
    r = _Replay()
    alloc_now = res_now = peak_alloc = peak_res = 0
    peak_entry: Mapping[str, Any] | None = None
    peak_from = 0  # index of the first entry of the window holding the peak
    n = len(trace)
    ends = _sample_ends(n, windows)
    live_allocs: dict[int, Mapping[str, Any]] = {}
    pop_live = live_allocs.pop
    claim = live_allocs.setdefault
    orphans: list[Mapping[str, Any]] = []
    drift: list[tuple[Mapping[str, Any], int]] = []
    named: dict[int, int] = {}  # id(alloc entry) -> place id; the entries outlive the pass
    entries = iter(trace)
    start = 0
    for end in ends or [n - 1]:
        for e in itertools.islice(entries, end + 1 - start):
            action = e["action"]
            if action == "alloc":
                prev = claim(e["addr"], e)
                if prev is not e:
                    orphans.append(prev)
                    live_allocs[e["addr"]] = e
                alloc_now += e["size"]
                if alloc_now > peak_alloc:
                    peak_alloc, peak_entry, peak_from = alloc_now, e, start
            elif action == "free_completed":
                size = e["size"]
                alloc_now -= size
                freed = pop_live(e["addr"], None)
                if freed is not None and freed["size"] != size:
                    drift.append((freed, freed["size"] - size))
            elif action == "segment_alloc" or action == "segment_map":
                res_now += e["size"]
                peak_res = max(peak_res, res_now)
            elif action == "segment_free" or action == "segment_unmap":
                res_now -= e["size"]
            elif action == "oom":
                r.oom_entries.append(e)
        if ends:
            r.samples.append(_window_sample(namer, live_allocs, orphans, drift, named))
        start = end + 1
    r.alloc_now, r.res_now, r.peak_alloc, r.peak_res = alloc_now, res_now, peak_alloc, peak_res
    if peak_entry is not None:  # found by identity in its window, not tracked per entry
        hits = map(operator.is_, itertools.islice(trace, peak_from, None), itertools.repeat(peak_entry))
        r.peak_idx = next(itertools.compress(itertools.count(peak_from), hits))
    return r


def _window_sample(
    namer: SiteNamer,
    live_allocs: Mapping[int, Mapping[str, Any]],
    orphans: Sequence[Mapping[str, Any]],
    drift: Sequence[tuple[Mapping[str, Any], int]],
    named: dict[int, int],
) -> dict[int, int]:
    """Live bytes per place at the end of one window (an allocation live over several is named once)."""
    sample: dict[int, int] = {}
    for e in itertools.chain(live_allocs.values(), orphans):
        pid = named.get(id(e))
        if pid is None:
            pid = named[id(e)] = namer.place_of(e.get("frames") or ())
        sample[pid] = sample.get(pid, 0) + e["size"]
    for e, delta in drift:
        pid = namer.place_of(e.get("frames") or ())
        sample[pid] = sample.get(pid, 0) + delta
    return sample


def _live_sites(
    active: Sequence[Mapping[str, Any]], extra: BlockExtra, namer: SiteNamer
) -> tuple[dict[int, list[int]], dict[int, list[Any]], bool]:
    """Live blocks per place: place id -> [bytes, blocks], one stack per place, and whether any had frames.

    Grouped by place, not by site alone: the blocks one script line keeps are told apart from
    those another line made at the same library line (and freed)."""
    sites: dict[int, list[int]] = {}
    stacks: dict[int, list[Any]] = {}
    has_frames = False
    for b in active:
        frames, _requested = extra(b)
        has_frames = has_frames or bool(frames)
        pid = namer.place_of(frames)
        acc = sites.setdefault(pid, [0, 0])
        acc[0] += int(b.get("size", 0))
        acc[1] += 1
        if pid not in stacks:
            stacks[pid] = frames
    return sites, stacks, has_frames


def _allocator_settings(
    snapshot: Mapping[str, Any], expandable: bool | None
) -> tuple[str | None, bool | None]:
    """The allocator's CONF settings as one line, and expandable_segments when the segments did not say."""
    settings = snapshot.get("allocator_settings")
    if not isinstance(settings, Mapping):
        return None, expandable
    if expandable is None and "expandable_segments" in settings:
        expandable = bool(settings["expandable_segments"])
    conf = [str(v) for k, v in settings.items() if "CONF" in str(k) and v]
    return ("; ".join(conf) if conf else None), expandable


def analyze_snapshot(
    snapshot: Mapping[str, Any],
    source: str,
    rank: int | None = None,
    *,
    top: int = 10,
    windows: int = 8,
    min_leak_bytes: int = MiB,
    block_extra: BlockExtra | None = None,
    frame_filter: FrameFilter | None = None,
) -> SnapshotSummary:
    """Summarise one snapshot: one pass over the segments, one over the trace.

    The trace pass is the hot loop (millions of entries): it replays the
    allocated/reserved totals and their peaks, and keeps the allocations live
    so far (address -> their entry), touching each entry only for the keys its
    action needs and allocating nothing per entry. Sites are named only for
    the allocations live at the ends of the leak windows, not per entry; the
    trace is read a second time only when there are leak suspects, to count
    their allocations and frees. The trace itself is never copied. The absolute
    start is the end state (segments) minus the net change over the trace.
    """
    namer = SiteNamer(frame_filter or frame_filter_fallback)
    segments: list[Mapping[str, Any]] = list(snapshot.get("segments") or [])
    traces: list[Sequence[Mapping[str, Any]]] = [t or [] for t in (snapshot.get("device_traces") or [])]
    st = _read_segments(segments)
    devices = sorted(set(st.end_res) | {i for i, t in enumerate(traces) if t})
    main = (
        max(devices, key=lambda d: (st.end_res.get(d, 0), len(traces[d]) if d < len(traces) else 0))
        if devices
        else 0
    )
    trace = traces[main] if main < len(traces) else []
    rp = _replay_trace(trace, windows, namer)
    ooms = [_oom_event(e, namer) for e in rp.oom_entries]
    sites, stacks, live_frames = _live_sites(st.active, block_extra or block_extra_fallback, namer)
    # frames recorded: on any live block, or on any allocation of the trace (usually the first)
    has_frames = any(e.get("frames") for e in trace if e["action"] == "alloc") or live_frames
    # pending-free blocks have had no free_completed yet: the trace still counts them
    start_alloc = st.end_alloc.get(main, 0) + st.pending_by_dev.get(main, 0) - rp.alloc_now
    start_res = st.end_res.get(main, 0) - rp.res_now
    peak_alloc = max(rp.peak_alloc + start_alloc, st.end_alloc.get(main, 0))
    peak_res = max(rp.peak_res + start_res, st.end_res.get(main, 0), rp.res_now + start_res)
    ranked = sorted(sites.items(), key=lambda kv: kv[1][0], reverse=True)
    shown = ranked[:top] + _outputs(namer, sites, ranked[top:])
    rest = [kv for kv in ranked[top:] if kv not in shown]
    settings_text, expandable = _allocator_settings(snapshot, st.expandable)
    return SnapshotSummary(
        source=source,
        rank=rank,
        devices=devices,
        allocated_bytes=sum(st.end_alloc.values()),
        reserved_bytes=sum(st.end_res.values()),
        pending_free_bytes=st.pending,
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=peak_res,
        peak_event_index=rp.peak_idx,
        trace_events=len(trace),
        segments=len(segments),
        expandable_segments=expandable,
        allocator_settings=settings_text,
        ooms=ooms[-5:],
        fragmentation=fragmentation(
            reserved=st.end_res.get(main, 0),
            allocated=st.end_alloc.get(main, 0),
            free_blocks=st.free_by_dev.get(main, []),
            failed_request=ooms[-1].requested_bytes if ooms else None,
        ),
        top_sites=[_site(namer, pid, v, stacks.get(pid, [])) for pid, v in shown],
        other_sites=len(rest),
        other_sites_bytes=sum(v[0] for _, v in rest),
        leak_suspects=_leak_suspects(rp.samples, namer, trace, min_leak_bytes)[:top],
        has_frames=has_frames,
        end_time_us=_end_time(trace),
    )


def _site(namer: SiteNamer, pid: int, held: list[int], frames: list[Any]) -> AllocationSite:
    """One top place: its live bytes and blocks, its stack, the job's script line on it and its caller."""
    site, script = namer.place(pid)
    return AllocationSite(
        site=site,
        script=script,
        live_bytes=held[0],
        blocks=held[1],
        stack=namer.stack(frames),
    )


def _outputs(
    namer: SiteNamer, sites: Mapping[int, list[int]], rest: list[tuple[int, list[int]]]
) -> list[tuple[int, list[int]]]:
    """The outputs of kept forwards left out of the top places (one small block per call): listed
    too, so that the graph their activations form can be read from the top places."""
    graphs = kept_graphs((*namer.place(pid), live, blocks) for pid, (live, blocks) in sites.items())
    outputs = {(g.output_site, g.script) for g in graphs[:3]}
    return [kv for kv in rest if namer.place(kv[0]) in outputs]


def _end_time(trace: Sequence[Mapping[str, Any]]) -> int | None:
    """The time of the trace's last entry that has one (snapshots of one rank are ordered by it)."""
    for e in reversed(trace):
        t = e.get("time_us")
        if isinstance(t, int):
            return t
    return None


def _oom_event(e: Mapping[str, Any], namer: SiteNamer) -> OomEvent:
    return OomEvent(
        requested_bytes=e["size"],
        device_free_bytes=int(e["device_free"]) if e.get("device_free") is not None else None,
        stream=e.get("stream"),
        site=namer.site(e["frames"]) if e.get("frames") else None,
    )


def _leak_suspects(
    samples: Sequence[Mapping[int, int]],
    namer: SiteNamer,
    trace: Sequence[Mapping[str, Any]],
    min_bytes: int,
) -> list[LeakSuspect]:
    """Sites whose live bytes never fell and rose in most windows, or whose trace keeps every Nth allocation.

    ``samples`` are the bytes of in-trace allocations still live at the end of
    each window, per site id. A site that holds ``min_bytes`` more at the end
    than in the first window it appeared in is read again too: when the trace
    frees all its allocations but every Nth (something keeps one in N: a plot
    every 10 steps), it leaks even if its windows did not grow steadily (a
    window may end inside a step). Only those sites are counted in a second
    pass, so a trace whose sites hold steady is read once.
    """
    if len(samples) < 3:
        return []
    grown_sites = {sid: _grown(samples, sid, min_bytes) for sid in sorted({k for s in samples for k in s})}
    found = {sid: g for sid, g in grown_sites.items() if g is not None}
    held = {sid for sid in samples[-1] if sid not in found and _net_growth(samples, sid) >= min_bytes}
    if not found and not held:
        return []
    wanted = set(found) | held
    counts = _alloc_counts(namer, trace, wanted)
    freeing = {namer.places[p][0] for p, site in counts.items() if site.frees}  # sites some place frees at
    out: list[tuple[int, LeakSuspect]] = []
    for sid, site in counts.items():
        if sid not in wanted:
            continue
        series = [sample.get(sid, 0) for sample in samples]
        every = kept_every(site.freed)
        if every is None and namer.places[sid][0] in freeing:
            every = _none_freed(site.freed, series)
        if sid not in found and every is None:
            continue
        first, grown = found.get(sid) or (next(i for i, v in enumerate(series) if v > 0), 0)
        name, script = namer.place(sid)
        leak = LeakSuspect(
            site=name,
            script=script,
            start_bytes=series[0],
            end_bytes=series[-1],
            growth_bytes=series[-1] - (series[first - 1] if first > 0 else 0),
            allocs=site.allocs,
            frees=site.frees,
            windows_grown=grown,
            windows=len(samples),
            kept_every=every,
            kept=site.freed.count(False),
        )
        out.append((site.order, leak))
    # largest growth first; ties in the order the sites first allocated
    out.sort(key=lambda t: (-t[1].growth_bytes, t[0]))
    return [s for _, s in out]


def _none_freed(freed: Sequence[bool], series: Sequence[int]) -> int | None:
    """1 when a place freed none of its allocations, at least 3, made at different times (its live
    bytes rose in 3 windows and never fell), at a site where another place frees its own (the
    caller checks that): every call from this script line is kept (an evaluation's outputs kept
    in a list), while the same library line reached from the training forward frees them. A
    model's parameters (no place frees them) and one forward in flight (one window) are not."""
    if len(freed) < 3 or any(freed):
        return None
    tail = list(itertools.dropwhile(lambda v: v == 0, series))
    diffs = [b - a for a, b in itertools.pairwise(tail)]
    if any(d < 0 for d in diffs) or 1 + sum(1 for d in diffs if d > 0) < 3:
        return None
    return 1


def _net_growth(samples: Sequence[Mapping[int, int]], sid: int) -> int:
    """Live bytes of a site at the end minus in the first window where it had any."""
    first = next((sample[sid] for sample in samples if sample.get(sid)), 0)
    return samples[-1].get(sid, 0) - first


def _grown(samples: Sequence[Mapping[int, int]], sid: int, min_bytes: int) -> tuple[int, int] | None:
    """(first window, windows grown) of a site whose live bytes never fell and rose in most windows."""
    series = [sample.get(sid, 0) for sample in samples]
    first = next((i for i, v in enumerate(series) if v > 0), None)
    if first is None:
        return None
    tail = series[first:]
    diffs = [b - a for a, b in itertools.pairwise(tail)]
    if any(d < 0 for d in diffs):
        return None
    grown = sum(1 for d in diffs if d > 0) + 1  # the window where it first appeared counts
    growth = series[-1] - (series[first - 1] if first > 0 else 0)
    if growth < min_bytes or grown < 3 or grown * 2 < len(samples):
        return None
    return first, grown


def ordinal(n: int) -> str:
    """2nd, 3rd, 10th, 21st: how 'every Nth' reads."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def kept_every(freed: Sequence[bool]) -> int | None:
    """N when every allocation but every Nth is freed (N >= 2, at least 3 kept), else None.

    The last allocations may still be live because their step was in flight when
    the snapshot was taken: up to two kept ones among the last N are left out
    when they break the stride.
    """
    kept = [i for i, f in enumerate(freed) if not f]
    for drop in range(3):
        strided = kept[: len(kept) - drop]
        if len(strided) < 3:
            break
        gaps = {b - a for a, b in itertools.pairwise(strided)}
        if len(gaps) != 1 or (n := gaps.pop()) < 2:
            continue
        in_flight = kept[len(strided) :]
        if len(freed) - 1 - strided[-1] < n and all(i >= len(freed) - n for i in in_flight):
            return n
    return None


@dataclass
class _SiteTrace:
    """One site's allocations over the whole trace: counts, which were freed, its first stack."""

    order: int
    frames: Sequence[Mapping[str, Any]] = ()
    frees: int = 0
    freed: list[bool] = field(default_factory=list)

    @property
    def allocs(self) -> int:
        return len(self.freed)


def _alloc_counts(
    namer: SiteNamer, trace: Sequence[Mapping[str, Any]], wanted: set[int]
) -> dict[int, _SiteTrace]:
    """The allocations over the whole trace of the wanted places and of the other places at their
    sites (which of them free theirs), in the order the places first allocated.

    Names every allocation's site once more (through the namer's cached prefixes), and the place
    only of an allocation at a wanted place's site; a free counts for the allocation at its address.
    """
    sites: dict[int, _SiteTrace] = {}
    addr_site: dict[int, tuple[int, int]] = {}  # addr -> (place id, index of the allocation at its place)
    site_of = namer.of
    place_of = namer.place_of
    stack_place = namer.stack_places.get
    last_at: dict[int, tuple[Any, int]] = {}  # site id -> (the last stack allocated there, its place)
    frame_site = namer.frame_site
    prefix_of = namer.prefixes.get
    wanted_sites = {namer.places[pid][0] for pid in wanted}
    for e in trace:
        action = e["action"]
        if action == "alloc":
            tframes = e.get("frames")
            if tframes:  # the namer's fast path, inlined: a known non-user prefix, then a user frame
                known = prefix_of(id(tframes[0]))
                if known is not None and tframes[: known[0]] == known[1] and len(tframes) > known[0]:
                    sid = frame_site(id(tframes[known[0]]), 0) or site_of(tframes)
                else:
                    sid = site_of(tframes)
            else:
                sid = namer.site_id(NO_FRAMES)
            pid = 0
            if sid in wanted_sites:  # its place: the last stack seen at the site again, else by identity
                last = last_at.get(sid)
                if last is not None and tframes == last[0]:
                    pid = last[1]
                else:
                    pid = stack_place(tuple(map(id, tframes or ()))) or place_of(tframes or (), sid)
                    last_at[sid] = (tframes, pid)
            if pid:
                site = sites.get(pid)
                if site is None:
                    site = sites[pid] = _SiteTrace(order=len(sites), frames=tframes or ())
                addr_site[e["addr"]] = (pid, len(site.freed))
                site.freed.append(False)
            else:
                addr_site.pop(e["addr"], None)
        elif action == "free_completed":
            hit = addr_site.pop(e["addr"], None)
            if hit is not None:
                site = sites[hit[0]]
                site.frees += 1
                site.freed[hit[1]] = True
    for pid in wanted - set(sites):
        sites[pid] = _SiteTrace(order=len(sites))
    return sites


def fragmentation(
    *, reserved: int, allocated: int, free_blocks: Sequence[tuple[int, str]], failed_request: int | None
) -> Fragmentation:
    """Classify an OOM: cached bytes were enough but split (fragmentation), or really exhausted.

    Before raising OOM the caching allocator already released every wholly
    unused segment, so free bytes left in reserved segments sit between live
    blocks: if they add up to the request but no single block is that large,
    the cure is ``expandable_segments``, not a smaller model. It is named only when
    the numbers at the failure say so: reserved well above allocated (a fifth of
    the reserved bytes free), not because the OOM message suggests it.
    """
    pool = "small" if failed_request is not None and failed_request <= SMALL_POOL_MAX else "large"
    usable = [s for s, t in free_blocks if failed_request is None or t == pool] or []
    free_total = sum(s for s, _ in free_blocks)
    largest = max((s for s, _ in free_blocks), default=0)
    if failed_request is None:
        return Fragmentation(
            reserved_bytes=reserved,
            allocated_bytes=allocated,
            free_in_reserved_bytes=free_total,
            largest_free_block_bytes=largest,
            kind="no_oom",
            explanation=f"No oom event in the trace; {fmt_bytes(free_total)} cached but unused, largest free block {fmt_bytes(largest)}.",
        )
    pool_free = sum(usable)
    pool_largest = max(usable, default=0)
    if pool_free >= failed_request > pool_largest and free_total * 5 >= reserved:
        kind = "fragmentation"
        text = (
            f"The failed request of {fmt_bytes(failed_request)} was smaller than the {fmt_bytes(pool_free)} free inside "
            f"reserved {pool}-pool segments, but the largest free block was only {fmt_bytes(pool_largest)}: "
            "the memory is there, split between live tensors."
        )
    else:
        kind = "exhaustion"
        text = (
            f"The failed request of {fmt_bytes(failed_request)} exceeded the free space left "
            f"({fmt_bytes(pool_free)} cached in {pool}-pool segments, largest block {fmt_bytes(pool_largest)}): "
            f"live tensors hold {fmt_bytes(allocated)} of {fmt_bytes(reserved)} reserved."
        )
    return Fragmentation(
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        free_in_reserved_bytes=free_total,
        largest_free_block_bytes=pool_largest,
        failed_request_bytes=failed_request,
        kind=kind,
        explanation=text,
    )


def _oom_finding(summary: SnapshotSummary, ranks: list[int]) -> list[Finding]:
    """The kind of the snapshot's OOM: fragmentation (free bytes in pieces too small) or exhaustion."""
    frag = summary.fragmentation
    if frag.kind == "fragmentation":
        fix = "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of splitting)."
        if summary.expandable_segments:
            fix = (
                "expandable_segments is already on: reduce the variety of tensor sizes (pad sequence lengths to "
                "buckets) or free large temporaries earlier."
            )
        return [
            Finding(
                kind="oom_fragmentation",
                severity="error",
                ranks=ranks,
                message=f"OOM from fragmentation in {summary.source}",
                explanation=frag.explanation,
                fix=fix,
                source=summary.source,
                facts={
                    "failed_request_bytes": frag.failed_request_bytes,
                    "largest_free_block_bytes": frag.largest_free_block_bytes,
                    "free_in_reserved_bytes": frag.free_in_reserved_bytes,
                },
                next_steps=[
                    NextStep(action="Read the fragmentation fixes.", skill_section=f"{SKILL}#fragmentation")
                ],
            )
        ]
    if frag.kind != "exhaustion" or summary.leak_suspects:
        return []  # a leak's own finding says what fills the memory, and its fix is not "hold less"
    site = summary.top_sites[0].site if summary.top_sites else "unknown"
    return [
        Finding(
            kind="oom_exhaustion",
            severity="error",
            ranks=ranks,
            message=f"OOM from real exhaustion in {summary.source}: the largest holder is {site}",
            explanation=frag.explanation,
            fix=(
                "Hold less at once: shard per layer (fully_shard on each block), activation checkpointing, "
                "smaller micro-batch; check the plan with `rankscope memory budget`."
            ),
            source=summary.source,
            facts={
                "failed_request_bytes": frag.failed_request_bytes,
                "allocated_bytes": frag.allocated_bytes,
                "reserved_bytes": frag.reserved_bytes,
                "top_site": site,
            },
            next_steps=[
                NextStep(
                    action="Check whether the sharding plan can fit.",
                    tool="memory_budget",
                    skill_section=f"{SKILL}#budget",
                ),
            ],
        )
    ]


def _leak_finding(summary: SnapshotSummary, leak: LeakSuspect, ranks: list[int]) -> Finding:
    where = leak.site + (f" (from {leak.script})" if leak.script else "")
    if leak.kept_every:
        how = (
            f"the trace frees every allocation there but every {ordinal(leak.kept_every)}: {leak.kept} of "
            f"{leak.allocs} kept"
        )
    else:
        how = (
            f"{leak.allocs} allocations, {leak.frees} frees; live bytes rose in {leak.windows_grown} of "
            f"{leak.windows} windows and never fell"
        )
    return Finding(
        kind="memory_leak_suspect",
        severity="warning",
        ranks=ranks,
        message=f"Leak at {where}: +{fmt_bytes(leak.growth_bytes)} over the trace",
        explanation=f"{how}.",
        fix=LEAK_FIX,
        source=summary.source,
        facts=leak.model_dump(exclude_defaults=True),
        next_steps=[NextStep(action="Read the leak section.", skill_section=f"{SKILL}#leak")],
    )


LEAK_FIX = (
    "Find what keeps these tensors at the script line: a slice or view of a big tensor keeps all of it "
    "(store .detach().clone() or .item()), a list of tensors, .detach() without a copy, a loss summed "
    "without .item() keeps every step's graph."
)


def snapshot_findings(summary: SnapshotSummary) -> list[Finding]:
    """Findings for one snapshot: the kind of OOM, leak suspects, missing frames."""
    ranks = [summary.rank] if summary.rank is not None else []
    out = _oom_finding(summary, ranks)
    out.extend(_leak_finding(summary, leak, ranks) for leak in summary.leak_suspects[:3])
    if not summary.has_frames and summary.allocated_bytes:
        out.append(
            Finding(
                kind="snapshot_without_frames",
                severity="info",
                ranks=ranks,
                message=f"{summary.source} has no stack traces: allocation sites are unknown",
                fix="Call torch.cuda.memory._record_memory_history(max_entries=100000) before the work, "
                "or rankscope.probe.record_oom_snapshots(dir).",
                source=summary.source,
            )
        )
    return out
