"""Pure memory analysis: snapshots, per-rank imbalance, and sharding budgets.

Everything here takes data (an unpickled ``_dump_snapshot`` dict, parsed
/proc text, a placement list) and returns models. No files, no /proc, no
subprocesses, no torch import: the shell in ``rankscope.memory`` does I/O and
may pass in torch's own ``_memory_viz`` helpers (``block_extra``,
``frame_filter``) so that rankscope reads snapshots exactly as PyTorch's
viewer does; the fallbacks below mirror them for hosts without torch.

Snapshot layout (``torch.cuda.memory._snapshot`` docstring): ``segments`` (each
with ``total_size``, ``segment_type`` 'small'/'large', ``blocks`` whose
``state`` is ``active_allocated`` / ``active_pending_free`` / ``inactive``,
``requested_size``, ``frames``) and ``device_traces`` (one list per device of
entries with ``action`` alloc / free_requested / free_completed /
segment_alloc / segment_free / segment_map / segment_unmap / oom / snapshot,
``addr`` (``device_free`` for oom), ``size``, ``frames``). Frames are
innermost first.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rankscope.analysis.units import MiB, fmt_bytes
from rankscope.analysis.units import parse_size as parse_size  # re-exported: the budget parses --gpu-memory
from rankscope.models.core import Finding, NextStep
from rankscope.models.memory import (
    AllocationSite,
    BudgetInput,
    BudgetReport,
    Fragmentation,
    LeakSuspect,
    MemoryProbeReport,
    OomEvent,
    ParamInfo,
    PlanBudget,
    RankMemory,
    RankMemoryStats,
    SnapshotSummary,
)

BlockExtra = Callable[[Mapping[str, Any]], tuple[list[Any], int]]
FrameFilter = Callable[[str, str], bool]

SMALL_POOL_MAX = MiB  # requests <= 1 MiB come from the small pool (CUDACachingAllocator kSmallSize)
SKILL = "skill/oom.md"
NO_FRAMES = "<no frames: record_memory_history was off>"


# ------------------------------------------------------------------ frames


def _block_extra_fallback(block: Mapping[str, Any]) -> tuple[list[Any], int]:
    """Same contract as ``torch.cuda._memory_viz._block_extra`` (new and legacy layouts)."""
    if "frames" in block:
        return list(block["frames"]), int(block.get("requested_size", block["size"]))
    if block.get("history"):
        first = block["history"][0]
        return list(first.get("frames", [])), int(first.get("real_size", block["size"]))
    return [], int(block.get("requested_size", block["size"]))


_NOISE_FUNCS = (
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
)
_NATIVE_SUFFIX = (".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cu", ".cuh")


def _is_native(filename: str) -> bool:
    """C/C++ frames: symbolized with a source suffix, or '??' when symbols are missing."""
    return filename in ("??", "") or filename.endswith(_NATIVE_SUFFIX) or ".so" in filename


def _frame_filter_fallback(name: str, filename: str) -> bool:
    """Keep frames the way ``_memory_viz._frame_filter`` does (drop interpreter/unwinder noise)."""
    return not any(n in name for n in _NOISE_FUNCS) and not name.startswith(("PyEval_", "PyObject_"))


def is_user_file(filename: str) -> bool:
    """True for frames outside torch, site-packages, the stdlib and native code."""
    if not filename or filename.startswith("<") or filename == "??":
        return False
    if filename.endswith(_NATIVE_SUFFIX):
        return False
    markers = ("/site-packages/", "/dist-packages/", "/torch/", "/lib/python3", "/lib64/python3")
    return not any(m in filename for m in markers)


def _fmt_frame(f: Mapping[str, Any]) -> str:
    return f"{f.get('filename', '?')}:{f.get('line', '?')} in {f.get('name', '?')}"


class _SiteNamer:
    """Names allocation sites by innermost user frame, as small integer ids.

    Symbolized snapshots share one dict per distinct frame, so each frame is
    classified once (keyed by identity: the snapshot outlives the namer, so the
    ids stay unique while they are used). Every allocation has its own frames
    list, but most stacks start with the same run of native and torch frames
    before the first user frame: ``prefixes`` remembers, per first frame, the
    last such run seen, so a stack costs one C-level list comparison and one
    lookup instead of a lookup per frame. Frames equal to known non-user ones
    classify the same (the verdict depends only on filename, line and name),
    so a match is exact. Site ids index ``names``; 0 is no site.
    """

    def __init__(self, frame_filter: FrameFilter) -> None:
        self.frame_filter = frame_filter
        self.names: list[str] = [""]
        self.ids: dict[str, int] = {}
        self._user: dict[int, int] = {}  # id(frame) -> site id of its text, 0 when not a user frame
        self.frame_site = self._user.get  # bound once: the hot loop inlines the lookup
        # id(first frame) -> (k, frames[:k]): a stack whose first user frame was at index k
        self.prefixes: dict[int, tuple[int, list[Any]]] = {}
        self._python: dict[int, int] = {}  # id(frame) -> site id of its text, 0 when native
        self._unknown = itertools.repeat(-1)  # the lookup default: truthy, so a scan stops there

    def site_id(self, name: str) -> int:
        """The id of a site text, registering it on first sight."""
        sid = self.ids.get(name)
        if sid is None:
            sid = self.ids[name] = len(self.names)
            self.names.append(name)
        return sid

    def _classify(self, f: Mapping[str, Any]) -> int:
        filename = str(f.get("filename", ""))
        user = self.frame_filter(str(f.get("name", "")), filename) and is_user_file(filename)
        sid = self.site_id(_fmt_frame(f)) if user else 0
        self._user[id(f)] = sid
        return sid

    def of(self, frames: Sequence[Mapping[str, Any]]) -> int:
        """Site id of a non-empty stack: its innermost user frame, else its innermost Python frame."""
        get = self._user.get
        known = self.prefixes.get(id(frames[0]))
        matched = known is not None and frames[: known[0]] == known[1]
        if matched and known is not None and len(frames) > known[0]:
            sid = get(id(frames[known[0]]), 0)
            if sid > 0:
                return sid
        for k, f in enumerate(frames):
            sid = get(id(f), -1)
            if sid < 0:
                sid = self._classify(f)
            if sid:
                if not matched:  # a prefix that still matches stays: most stacks share it
                    self.prefixes[id(frames[0])] = (k, list(frames[:k]))
                return sid
        return self._fallback(frames)

    def _fallback(self, frames: Sequence[Mapping[str, Any]]) -> int:
        """No user frame: the innermost Python frame, else the innermost frame."""
        py = self._python
        sid: int = next(filter(None, map(py.get, map(id, frames), self._unknown)), 0)
        if sid > 0:
            return sid
        if sid < 0:
            for f in frames:
                sid = py.get(id(f), -1)
                if sid < 0:
                    sid = py[id(f)] = (
                        0 if _is_native(str(f.get("filename", ""))) else self.site_id(_fmt_frame(f))
                    )
                if sid:
                    return sid
        return self.site_id(_fmt_frame(frames[0]))

    def site(self, frames: Sequence[Mapping[str, Any]]) -> str:
        return self.names[self.of(frames)] if frames else NO_FRAMES

    def stack(self, frames: Sequence[Mapping[str, Any]], limit: int = 8) -> list[str]:
        out = [
            _fmt_frame(f)
            for f in frames
            if self.frame_filter(str(f.get("name", "")), str(f.get("filename", "")))
        ]
        python = [s for s in out if not _is_native(s.split(":", 1)[0])]
        return (python or out)[:limit]


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
    their allocations and frees. The trace itself is never copied.
    """
    extra = block_extra or _block_extra_fallback
    namer = _SiteNamer(frame_filter or _frame_filter_fallback)
    segments: list[Mapping[str, Any]] = list(snapshot.get("segments") or [])
    traces: list[Sequence[Mapping[str, Any]]] = [t or [] for t in (snapshot.get("device_traces") or [])]

    end_alloc: dict[int, int] = {}
    end_res: dict[int, int] = {}
    pending = 0
    active: list[Mapping[str, Any]] = []  # active_allocated blocks, named after the trace pass
    free_by_dev: dict[int, list[tuple[int, str]]] = {}  # device -> [(size, segment_type)]
    pending_by_dev: dict[int, int] = {}
    expandable: bool | None = None
    for seg in segments:
        dev = _seg_device(seg)
        end_res[dev] = end_res.get(dev, 0) + int(seg.get("total_size", 0))
        if "is_expandable" in seg:
            expandable = bool(seg["is_expandable"]) or bool(expandable)
        seg_type = str(seg.get("segment_type", "large"))
        for b in seg.get("blocks") or []:
            state = b.get("state")
            size = int(b.get("size", 0))
            if state == "active_allocated":
                end_alloc[dev] = end_alloc.get(dev, 0) + size
                active.append(b)
            elif state == "inactive":
                free_by_dev.setdefault(dev, []).append((size, seg_type))
            else:  # active_pending_free / active_awaiting_free: freed, but no free_completed yet
                pending += size
                pending_by_dev[dev] = pending_by_dev.get(dev, 0) + size

    devices = sorted(set(end_res) | {i for i, t in enumerate(traces) if t})
    main = (
        max(devices, key=lambda d: (end_res.get(d, 0), len(traces[d]) if d < len(traces) else 0))
        if devices
        else 0
    )
    trace = traces[main] if main < len(traces) else []

    # One forward pass with totals relative to the start of the trace; the
    # absolute start is the end state (segments) minus the net change. Per
    # entry it only replays the totals and keeps the live in-trace allocations
    # (address -> alloc entry); sites are named at the window ends, for the
    # allocations live there (a few thousand), not for each of the millions of
    # entries. Alloc/free counts are only reported for leak suspects: they are
    # counted in a second pass when there are any.
    alloc_now = res_now = 0
    peak_alloc = peak_res = 0
    peak_entry: Mapping[str, Any] | None = None
    peak_from = 0  # index of the first entry of the window holding the peak
    n = len(trace)
    ends = _sample_ends(n, windows)
    live_allocs: dict[int, Mapping[str, Any]] = {}
    pop_live = live_allocs.pop
    claim = live_allocs.setdefault
    # Inconsistent traces keep their bytes where a per-site running sum would:
    # an alloc over a live address leaves the old one counted for good, and a
    # free of another size than its alloc leaves the difference.
    orphans: list[Mapping[str, Any]] = []
    drift: list[tuple[Mapping[str, Any], int]] = []
    samples: list[dict[int, int]] = []
    named: dict[int, int] = {}  # id(alloc entry) -> site id; the entries outlive the pass
    oom_entries: list[Mapping[str, Any]] = []
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
                    peak_alloc = alloc_now
                    peak_entry = e
                    peak_from = start
            elif action == "free_completed":
                size = e["size"]
                alloc_now -= size
                freed = pop_live(e["addr"], None)
                if freed is not None and freed["size"] != size:
                    drift.append((freed, freed["size"] - size))
            elif action == "free_requested":
                pass
            elif action == "segment_alloc" or action == "segment_map":
                res_now += e["size"]
                if res_now > peak_res:
                    peak_res = res_now
            elif action == "segment_free" or action == "segment_unmap":
                res_now -= e["size"]
            elif action == "oom":
                oom_entries.append(e)
        if ends:
            sample: dict[int, int] = {}
            for e in itertools.chain(live_allocs.values(), orphans):
                sid = named.get(id(e))  # an allocation live over several windows is named once
                if sid is None:
                    sid = named[id(e)] = _entry_site(namer, e)
                sample[sid] = sample.get(sid, 0) + e["size"]
            for e, delta in drift:
                sid = _entry_site(namer, e)
                sample[sid] = sample.get(sid, 0) + delta
            samples.append(sample)
        start = end + 1
    del live_allocs, orphans, drift, named
    peak_idx: int | None = None
    if peak_entry is not None:  # found by identity in its window, not tracked per entry
        hits = map(operator.is_, itertools.islice(trace, peak_from, None), itertools.repeat(peak_entry))
        peak_idx = next(itertools.compress(itertools.count(peak_from), hits))
    ooms = [
        OomEvent(
            requested_bytes=e["size"],
            device_free_bytes=int(e["device_free"]) if e.get("device_free") is not None else None,
            stream=e.get("stream"),
            site=namer.site(e["frames"]) if e.get("frames") else None,
        )
        for e in oom_entries
    ]
    # frames recorded: on any live block (below), or on any allocation of the trace (usually the first)
    has_frames = any(e.get("frames") for e in trace if e["action"] == "alloc")

    sites: dict[str, list[int]] = {}  # site -> [bytes, blocks]
    stacks: dict[str, list[Any]] = {}  # site -> frames of one of its blocks (rendered for the top sites only)
    for b in active:
        frames, _requested = extra(b)
        has_frames = has_frames or bool(frames)
        name = namer.site(frames)
        acc = sites.setdefault(name, [0, 0])
        acc[0] += int(b.get("size", 0))
        acc[1] += 1
        if name not in stacks:
            stacks[name] = frames

    # pending-free blocks have had no free_completed yet: the trace still counts them
    start_alloc = end_alloc.get(main, 0) + pending_by_dev.get(main, 0) - alloc_now
    start_res = end_res.get(main, 0) - res_now
    peak_alloc += start_alloc
    peak_res += start_res
    res_now += start_res
    peak_alloc = max(peak_alloc, end_alloc.get(main, 0))
    peak_res = max(peak_res, end_res.get(main, 0), res_now)

    leaks = _leak_suspects(samples, namer, trace, min_leak_bytes)
    frag = fragmentation(
        reserved=end_res.get(main, 0),
        allocated=end_alloc.get(main, 0),
        free_blocks=free_by_dev.get(main, []),
        failed_request=ooms[-1].requested_bytes if ooms else None,
    )
    ranked = sorted(sites.items(), key=lambda kv: kv[1][0], reverse=True)
    top_sites = [
        AllocationSite(site=name, live_bytes=v[0], blocks=v[1], stack=namer.stack(stacks.get(name, [])))
        for name, v in ranked[:top]
    ]
    rest = ranked[top:]
    settings = snapshot.get("allocator_settings")
    settings_text: str | None = None
    if isinstance(settings, Mapping):
        if expandable is None and "expandable_segments" in settings:
            expandable = bool(settings["expandable_segments"])
        conf = [str(v) for k, v in settings.items() if "CONF" in str(k) and v]
        settings_text = "; ".join(conf) if conf else None
    return SnapshotSummary(
        source=source,
        rank=rank,
        devices=devices,
        allocated_bytes=sum(end_alloc.values()),
        reserved_bytes=sum(end_res.values()),
        pending_free_bytes=pending,
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=peak_res,
        peak_event_index=peak_idx,
        trace_events=len(trace),
        segments=len(segments),
        expandable_segments=expandable,
        allocator_settings=settings_text,
        ooms=ooms[-5:],
        fragmentation=frag,
        top_sites=top_sites,
        other_sites=len(rest),
        other_sites_bytes=sum(v[0] for _, v in rest),
        leak_suspects=leaks[:top],
        has_frames=has_frames,
    )


def _entry_site(namer: _SiteNamer, e: Mapping[str, Any]) -> int:
    """Site id of an alloc entry (its stack's user frame, or the no-frames marker)."""
    tframes = e.get("frames")
    return namer.of(tframes) if tframes else namer.site_id(NO_FRAMES)


def _leak_suspects(
    samples: Sequence[Mapping[int, int]],
    namer: _SiteNamer,
    trace: Sequence[Mapping[str, Any]],
    min_bytes: int,
) -> list[LeakSuspect]:
    """Sites whose live bytes never fell and rose in most windows of the trace.

    ``samples`` are the bytes of in-trace allocations still live at the end of
    each window, per site id. Only when some site qualifies is the trace read
    again, to count that site's allocations and frees.
    """
    if len(samples) < 3:
        return []
    found: list[tuple[int, list[int], int, int]] = []  # (site id, series, first window, windows grown)
    for sid in sorted({k for sample in samples for k in sample}):
        series = [sample.get(sid, 0) for sample in samples]
        first = next((i for i, v in enumerate(series) if v > 0), None)
        if first is None:
            continue
        tail = series[first:]
        diffs = [b - a for a, b in itertools.pairwise(tail)]
        if any(d < 0 for d in diffs):
            continue
        grown = sum(1 for d in diffs if d > 0) + 1  # the window where it first appeared counts
        growth = series[-1] - (series[first - 1] if first > 0 else 0)
        if growth < min_bytes or grown < 3 or grown * 2 < len(samples):
            continue
        found.append((sid, series, first, grown))
    if not found:
        return []
    counts = _alloc_counts(namer, trace, {sid for sid, *_ in found})
    out: list[tuple[int, LeakSuspect]] = []
    for sid, series, first, grown in found:
        allocs, frees, order = counts[sid]
        out.append(
            (
                order,
                LeakSuspect(
                    site=namer.names[sid],
                    start_bytes=series[0],
                    end_bytes=series[-1],
                    growth_bytes=series[-1] - (series[first - 1] if first > 0 else 0),
                    allocs=allocs,
                    frees=frees,
                    windows_grown=grown,
                    windows=len(samples),
                ),
            )
        )
    # largest growth first; ties in the order the sites first allocated
    out.sort(key=lambda t: (-t[1].growth_bytes, t[0]))
    return [s for _, s in out]


def _alloc_counts(
    namer: _SiteNamer, trace: Sequence[Mapping[str, Any]], wanted: set[int]
) -> dict[int, tuple[int, int, int]]:
    """(allocs, frees, rank of its first allocation among them) of the wanted sites, over the whole trace.

    Names every allocation once more (through the namer's cached prefixes); a
    free counts for the site of the allocation at its address.
    """
    allocs: dict[int, int] = {}
    frees: dict[int, int] = {}
    first: dict[int, int] = {}
    addr_site: dict[int, int] = {}
    site_of = namer.of
    frame_site = namer.frame_site
    prefix_of = namer.prefixes.get
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
            addr_site[e["addr"]] = sid
            if sid in wanted:
                allocs[sid] = allocs.get(sid, 0) + 1
                if sid not in first:
                    first[sid] = len(first)
        elif action == "free_completed":
            sid = addr_site.pop(e["addr"], 0)
            if sid in wanted:
                frees[sid] = frees.get(sid, 0) + 1
    return {sid: (allocs.get(sid, 0), frees.get(sid, 0), first.get(sid, len(wanted))) for sid in wanted}


def fragmentation(
    *, reserved: int, allocated: int, free_blocks: Sequence[tuple[int, str]], failed_request: int | None
) -> Fragmentation:
    """Classify an OOM: cached bytes were enough but split (fragmentation), or really exhausted.

    Before raising OOM the caching allocator already released every wholly
    unused segment, so free bytes left in reserved segments sit between live
    blocks: if they add up to the request but no single block is that large,
    the cure is ``expandable_segments``, not a smaller model.
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
    if pool_free >= failed_request > pool_largest:
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


def snapshot_findings(summary: SnapshotSummary) -> list[Finding]:
    """Findings for one snapshot: the kind of OOM, leak suspects, missing frames."""
    ranks = [summary.rank] if summary.rank is not None else []
    out: list[Finding] = []
    frag = summary.fragmentation
    if frag.kind == "fragmentation":
        fix = "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of splitting)."
        if summary.expandable_segments:
            fix = (
                "expandable_segments is already on: reduce the variety of tensor sizes (pad sequence lengths to "
                "buckets) or free large temporaries earlier."
            )
        out.append(
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
        )
    elif frag.kind == "exhaustion":
        site = summary.top_sites[0].site if summary.top_sites else "unknown"
        out.append(
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
        )
    for leak in summary.leak_suspects[:3]:
        out.append(
            Finding(
                kind="memory_leak_suspect",
                severity="warning",
                ranks=ranks,
                message=f"Live bytes from {leak.site} only grew: +{fmt_bytes(leak.growth_bytes)} over the trace",
                explanation=(
                    f"{leak.allocs} allocations, {leak.frees} frees; live bytes rose in {leak.windows_grown} of "
                    f"{leak.windows} windows and never fell. Typical causes: appending tensors that keep their "
                    "graph (loss history without .item()/.detach()), caches keyed by step, growing buffers."
                ),
                fix="Store .item() or .detach() results, clear the container, or bound the cache at this line.",
                source=summary.source,
                facts=leak.model_dump(),
                next_steps=[NextStep(action="Read the leak section.", skill_section=f"{SKILL}#leak")],
            )
        )
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


def _imbalance_finding(what: str, flagged: list[tuple[int, int, int]], source: str | None) -> Finding:
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
            out.append(_imbalance_finding(what, flagged, None))
    return out


def compare_snapshots(summaries: Sequence[SnapshotSummary], *, min_abs: int = 256 * MiB) -> list[Finding]:
    """One rank's peak far above the other ranks' (snapshot files of several ranks)."""
    peaks = {s.rank: s.peak_allocated_bytes for s in summaries if s.rank is not None}
    flagged = imbalance(peaks, min_abs=min_abs)
    return [_imbalance_finding("peak allocated CUDA memory", flagged, "snapshots")] if flagged else []


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


# ------------------------------------------------------------------ budget

_DTYPE_BYTES = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "tf32": 4,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "int64": 8,
    "long": 8,
    "int32": 4,
    "int": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}
_OPTIMIZER_STATES = {
    "adam": 2.0,
    "adamw": 2.0,
    "fusedadam": 2.0,
    "lamb": 2.0,
    "nadam": 2.0,
    "radam": 2.0,
    "sgd": 1.0,
    "sgd_momentum": 1.0,
    "sgd_nomomentum": 0.0,
    "none": 0.0,
    "adagrad": 1.0,
    "rmsprop": 1.0,
    "lion": 1.0,
    "adafactor": 0.0,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ('torch.bfloat16', 'bf16', 'float8_e4m3fn')."""
    name = dtype.lower().removeprefix("torch.")
    if name.startswith("float8") or name.startswith("fp8"):
        return 1
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(_DTYPE_BYTES))}, float8_*")
    return _DTYPE_BYTES[name]


def optimizer_states(optimizer: str) -> float:
    """Optimizer state tensors per parameter element (Adam keeps exp_avg and exp_avg_sq: 2)."""
    name = optimizer.lower().replace("-", "_")
    try:
        return float(name)
    except ValueError:
        pass
    if name not in _OPTIMIZER_STATES:
        raise ValueError(
            f"unknown optimizer {optimizer!r}; use one of {', '.join(sorted(_OPTIMIZER_STATES))} or a number"
        )
    return _OPTIMIZER_STATES[name]


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _dim0_shard(shape: Sequence[int], world: int) -> int:
    """Elements of the largest dim-0 shard FSDP2 keeps per rank (it pads to equal chunks)."""
    if not shape:
        return 1
    return math.ceil(shape[0] / world) * _numel(shape[1:])


_LAYER = re.compile(r"^(.*?(?:^|\.)\d+)(?:\.|$)")


def layer_unit(fqn: str) -> str:
    """The per-layer FSDP unit of a parameter: the prefix up to its first numeric part ('layers.3'), '' for the root."""
    m = _LAYER.match(fqn)
    return m.group(1) if m else ""


def budget_input_from_data(data: Any, world_size: int | None = None) -> BudgetInput:
    """Accept rankscope's ``BudgetInput`` JSON, or a placement report's parameter list.

    Placement reports name fields a little differently depending on where they
    come from (live probe or DCP metadata); this reads the common spellings and
    picks, for a multi-rank report, the rank holding the most bytes.
    """
    if (
        isinstance(data, Mapping)
        and isinstance(data.get("ranks"), list)
        and data["ranks"]
        and isinstance(data["ranks"][0], Mapping)
        and _param_list(data["ranks"][0])
    ):
        options = [budget_input_from_data(r, world_size or data.get("world_size")) for r in data["ranks"]]
        return max(
            options,
            key=lambda b: sum(
                _numel(p.local_shape if p.local_shape is not None else p.shape) for p in b.params
            ),
        )
    if isinstance(data, list):
        data = {"params": data}
    if not isinstance(data, Mapping):
        raise ValueError("the placement input is neither a JSON object nor a list of parameters")
    raw = _param_list(data)
    if raw is None:
        raise ValueError(
            "no parameter list found: expected a 'params' list of {fqn, shape, local_shape, dtype, placements, unit}"
        )
    units = _fsdp_units(data)
    params: list[ParamInfo] = []
    for p in raw:
        fqn = str(p.get("fqn") or p.get("name") or p.get("key") or "")
        if p.get("kind", "param") != "param" or fqn.split(".", 1)[0] in _NOT_MODEL:
            continue  # buffers, optimizer state and other checkpoint entries are not parameters
        shape = p.get("global_shape") or p.get("shape") or p.get("size") or []
        local = p.get("local_shape")
        placements = p.get("placements") or []
        unit = p.get("fsdp_unit", p.get("unit"))
        if unit is None and units:
            unit = max(
                (u for u in units if u == "" or fqn == u or fqn.startswith(u + ".")), key=len, default=None
            )
        params.append(
            ParamInfo(
                fqn=fqn,
                shape=[int(x) for x in shape],
                local_shape=[int(x) for x in local] if local is not None else None,
                dtype=str(p.get("dtype") or "float32").removeprefix("torch."),
                placements=[
                    str(x) if not isinstance(x, Mapping) else str(x.get("kind") or x) for x in placements
                ],
                unit=unit,
            )
        )
    ws = world_size or data.get("world_size") or _mesh_size(data)
    fsdp = bool(units) if isinstance(data.get("wrapping"), list) else None
    return BudgetInput(world_size=int(ws) if ws else None, rank=data.get("rank"), fsdp=fsdp, params=params)


_NOT_MODEL = frozenset(
    {
        "optim",
        "optimizer",
        "optimizers",
        "lr_scheduler",
        "scheduler",
        "dataloader",
        "train_state",
        "extra_state",
    }
)


def _fsdp_units(data: Mapping[str, Any]) -> list[str]:
    """Module fqns wrapped by FSDP (fully_shard or FSDP1) in a placement report's ``wrapping`` list."""
    wrapping = data.get("wrapping")
    if not isinstance(wrapping, list):
        return []
    return [
        str(w.get("fqn", ""))
        for w in wrapping
        if isinstance(w, Mapping) and str(w.get("wrapping", "")).startswith("fsdp")
    ]


def _param_list(data: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    for key in ("params", "parameters", "tensors", "entries", "placements"):
        value = data.get(key)
        if isinstance(value, list) and (not value or isinstance(value[0], Mapping)):
            return value
    return None


def _mesh_size(data: Mapping[str, Any]) -> int | None:
    mesh = data.get("mesh_shape") or data.get("mesh")
    if isinstance(mesh, list) and mesh and all(isinstance(x, int) for x in mesh):
        return math.prod(mesh)
    return None


def _plan(
    name: str,
    params: Sequence[ParamInfo],
    local_elems: Callable[[ParamInfo], int],
    unit_of: Callable[[ParamInfo], str] | None,
    pb: int,
    gb: int,
    ob: int,
    states: float,
    gpu: int | None,
) -> PlanBudget:
    local = sum(local_elems(p) for p in params)
    units: dict[str, int] = {}
    if unit_of is not None:
        for p in params:
            u = unit_of(p)
            units[u] = units.get(u, 0) + _numel(p.shape)
    largest = max(units.items(), key=lambda kv: kv[1]) if units else None
    ag = largest[1] * pb if largest else 0
    rs = largest[1] * gb if largest else 0
    params_b, grads_b, optim_b = local * pb, local * gb, int(local * states * ob)
    total = params_b + grads_b + optim_b + ag + rs
    return PlanBudget(
        plan=name,
        units=len(units) or 1,
        params_bytes=params_b,
        grads_bytes=grads_b,
        optimizer_bytes=optim_b,
        allgather_peak_bytes=ag,
        largest_unit=(largest[0] or "<root>") if largest else None,
        reduce_scatter_peak_bytes=rs,
        total_bytes=total,
        fits=None if gpu is None else total <= gpu,
        headroom_bytes=None if gpu is None else gpu - total,
    )


def compute_budget(
    inp: BudgetInput,
    *,
    source: str,
    optimizer: str = "adam",
    param_dtype: str = "float32",
    grad_dtype: str | None = None,
    optim_dtype: str = "float32",
    gpu_memory: int | None = None,
    world_size: int | None = None,
) -> BudgetReport:
    """Per-rank bytes of params, grads and optimizer state for the given plan and three standard ones.

    Activations, the CUDA context (~0.5-1 GiB) and NCCL buffers are not
    counted: the headroom is what is left for them.
    """
    world = world_size or inp.world_size
    if not world or world < 1:
        raise ValueError("world size unknown: pass --world-size (the placement input does not say)")
    grad_dtype = grad_dtype or param_dtype
    pb, gb, ob = dtype_bytes(param_dtype), dtype_bytes(grad_dtype), dtype_bytes(optim_dtype)
    states = optimizer_states(optimizer)
    params = inp.params
    plans: list[PlanBudget] = []
    sharded = [
        p for p in params if p.local_shape is not None and any(pl.startswith("Shard") for pl in p.placements)
    ]
    if any(p.local_shape is not None for p in params):
        has_units = any(p.unit is not None for p in params)
        if inp.fsdp is False:
            sharded = []  # DTensor (TP) or DDP plan: nothing is all-gathered per unit
        plans.append(
            _plan(
                "as_given",
                params,
                lambda p: _numel(p.local_shape) if p.local_shape is not None else _numel(p.shape),
                (lambda p: p.unit or "")
                if has_units
                else ((lambda p: layer_unit(p.fqn)) if sharded else None),
                pb,
                gb,
                ob,
                states,
                gpu_memory,
            )
        )
    full = lambda p: _numel(p.shape)  # noqa: E731
    shard = lambda p: _dim0_shard(p.shape, world)  # noqa: E731
    plans.append(_plan("ddp", params, full, None, pb, gb, ob, states, gpu_memory))
    plans.append(
        _plan("fsdp_per_layer", params, shard, lambda p: layer_unit(p.fqn), pb, gb, ob, states, gpu_memory)
    )
    plans.append(_plan("fsdp_root_only", params, shard, lambda p: "", pb, gb, ob, states, gpu_memory))
    findings: list[Finding] = []
    recommended = None
    if gpu_memory is not None:
        fitting = [p for p in plans if p.fits and p.plan != "as_given"]
        recommended = min(fitting, key=lambda p: p.total_bytes).plan if fitting else None
        given = plans[0] if plans[0].plan == "as_given" else None
        if given is not None and not given.fits:
            findings.append(
                Finding(
                    kind="budget_does_not_fit",
                    severity="error",
                    message=(
                        f"the plan as given needs {fmt_bytes(given.total_bytes)} per rank before activations; "
                        f"the GPU has {fmt_bytes(gpu_memory)}"
                    ),
                    fix=(
                        f"Switch to {recommended}."
                        if recommended
                        else "No standard plan fits: add ranks, use "
                        "lower-precision optimizer states, or offload (CPUOffloadPolicy)."
                    ),
                    facts={
                        "total_bytes": given.total_bytes,
                        "gpu_memory_bytes": gpu_memory,
                        "recommended": recommended,
                    },
                    next_steps=[NextStep(action="Read the budget section.", skill_section=f"{SKILL}#budget")],
                )
            )
        elif recommended is None:
            findings.append(
                Finding(
                    kind="budget_does_not_fit",
                    severity="error",
                    message=f"none of DDP, per-layer FSDP or root-only FSDP fits in {fmt_bytes(gpu_memory)} per rank",
                    fix="Add ranks, keep optimizer states in lower precision, or offload them (CPUOffloadPolicy).",
                    facts={"gpu_memory_bytes": gpu_memory},
                )
            )
    per_layer = next(p for p in plans if p.plan == "fsdp_per_layer")
    total_full = sum(_numel(p.shape) for p in params) * pb
    if per_layer.units > 1 and total_full and per_layer.allgather_peak_bytes > 0.5 * total_full:
        findings.append(
            Finding(
                kind="fsdp_unit_too_large",
                severity="warning",
                message=f"the largest FSDP unit ({per_layer.largest_unit}) holds over half of the model",
                fix="Wrap smaller modules with fully_shard so that no single all-gather materialises most of the model.",
                facts={
                    "largest_unit": per_layer.largest_unit,
                    "allgather_peak_bytes": per_layer.allgather_peak_bytes,
                },
            )
        )
    notes = [
        "Activations, the CUDA context (about 0.5-1 GiB) and NCCL buffers are not included: headroom must cover them.",
        "FSDP peaks assume one unit unsharded at a time; forward/backward prefetch can hold two.",
        "DDP with gradient_as_bucket_view=False keeps a second copy of the gradients in its buckets.",
        "Per-layer units are read from parameter names (the prefix up to the first number, e.g. 'layers.3').",
    ]
    return BudgetReport(
        source=source,
        world_size=world,
        optimizer=optimizer,
        optimizer_states=states,
        param_dtype=param_dtype,
        grad_dtype=grad_dtype,
        optim_dtype=optim_dtype,
        total_params=sum(_numel(p.shape) for p in params),
        gpu_memory_bytes=gpu_memory,
        plans=plans,
        recommended=recommended,
        findings=findings,
        notes=notes,
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
        out.append(_imbalance_finding(what, flagged, "memory_report"))
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
