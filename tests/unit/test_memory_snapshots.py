"""Snapshot analysis on files in the real ``_dump_snapshot`` layout, built with known values.

The pure tests; the ones that start processes are in tests/integration/test_memory_snapshots.py.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from rankscope import api
from rankscope.analysis.memory import (
    analyze_snapshot,
    parse_kb_fields,
    parse_nvidia_smi_apps,
    rank_from_filename,
)
from rankscope.capabilities.memory import SnapshotUnreadable, load_snapshot
from rankscope.errors import InvalidInput
from rankscope.mcp_server import build_server
from tests.snapshot_builder import GiB, MiB, SnapshotBuilder, user_frames

TRAIN = "/work/job/train.py"


def fragmented(tmp: Path, name: str = "snapshot-rank0.pickle") -> Path:
    """Ten 10 MiB tensors in one 100 MiB segment, every other one freed, then a 20 MiB request fails."""
    b = SnapshotBuilder()
    seg = b.segment(100 * MiB)
    addrs = [b.alloc(10 * MiB, user_frames(TRAIN, 40 + i % 2, "forward"), seg) for i in range(10)]
    for a in addrs[::2]:
        b.free(a)
    b.oom(20 * MiB, device_free=2 * MiB, frames=user_frames(TRAIN, 77, "forward"))
    return b.dump(tmp / name)


def test_fragmentation_is_told_apart_from_exhaustion(tmp_path: Path) -> None:
    report = api.inspect_memory(paths=[str(fragmented(tmp_path))])
    s = report.snapshots[0]
    assert s.rank == 0
    assert s.reserved_bytes == 100 * MiB
    assert s.allocated_bytes == 50 * MiB
    assert s.peak_allocated_bytes == 100 * MiB
    frag = s.fragmentation
    assert frag.kind == "fragmentation"
    assert frag.failed_request_bytes == 20 * MiB
    assert frag.largest_free_block_bytes == 10 * MiB
    assert frag.free_in_reserved_bytes == 50 * MiB
    assert s.ooms[0].device_free_bytes == 2 * MiB
    assert s.ooms[0].site == f"{TRAIN}:77 in forward"
    kinds = [f.kind for f in report.findings]
    assert "oom_fragmentation" in kinds
    finding = next(f for f in report.findings if f.kind == "oom_fragmentation")
    assert "expandable_segments:True" in finding.fix
    assert finding.ranks == [0]


def test_exhaustion_names_the_biggest_holder(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    seg = b.segment(64 * MiB)
    b.alloc(48 * MiB, user_frames(TRAIN, 12, "build_model"), seg)
    b.alloc(16 * MiB, user_frames(TRAIN, 30, "forward"), seg)
    b.oom(32 * MiB, device_free=0)
    report = api.inspect_memory(paths=[str(b.dump(tmp_path / "oom.pickle"))])
    s = report.snapshots[0]
    assert s.rank is None  # a lone file without 'rank' in its name
    assert s.fragmentation.kind == "exhaustion"
    assert [t.site for t in s.top_sites] == [f"{TRAIN}:12 in build_model", f"{TRAIN}:30 in forward"]
    assert s.top_sites[0].live_bytes == 48 * MiB
    # the stack keeps the user frame and drops nothing but unwinder noise
    assert f"{TRAIN}:12 in build_model" in s.top_sites[0].stack
    f = next(f for f in report.findings if f.kind == "oom_exhaustion")
    assert f.facts["top_site"] == f"{TRAIN}:12 in build_model"


def test_peak_is_replayed_from_the_trace(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    keep = b.alloc(30 * MiB, user_frames(TRAIN, 5, "setup"))
    tmp = b.alloc(70 * MiB, user_frames(TRAIN, 9, "step"))
    b.free(tmp)
    b.alloc(20 * MiB, user_frames(TRAIN, 11, "step"))
    assert keep
    s = analyze_snapshot(b.build(), "x", top=5)
    assert s.allocated_bytes == 50 * MiB
    assert s.peak_allocated_bytes == 100 * MiB
    assert s.peak_event_index is not None
    assert s.trace_events == len(b.trace)
    assert s.fragmentation.kind == "no_oom"


def test_leak_suspect_is_the_site_that_only_grows(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    for step in range(40):
        act = b.alloc(8 * MiB, user_frames(TRAIN, 50, "forward"))
        b.alloc(2 * MiB, user_frames(TRAIN, 88, "train_step"))  # loss history kept with its graph
        b.free(act)
        assert step >= 0
    report = api.inspect_memory(paths=[str(b.dump(tmp_path / "snapshot-rank3.pickle"))], top=3)
    s = report.snapshots[0]
    assert [leak.site for leak in s.leak_suspects] == [f"{TRAIN}:88 in train_step"]
    leak = s.leak_suspects[0]
    assert leak.allocs == 40 and leak.frees == 0
    assert leak.end_bytes == 80 * MiB
    assert leak.windows_grown == leak.windows
    f = next(f for f in report.findings if f.kind == "memory_leak_suspect")
    assert f.ranks == [3]


def test_rank_above_the_others_in_a_directory(tmp_path: Path) -> None:
    d = tmp_path / "oom"
    d.mkdir()
    for rank in range(3):
        b = SnapshotBuilder()
        b.alloc(1 * GiB, user_frames(TRAIN, 20, "forward"))
        if rank == 2:
            b.alloc(3 * GiB, user_frames(TRAIN, 61, "log_full_batch"))  # rank-specific work
        b.dump(d / f"snapshot-rank{rank}.pickle")
    report = api.inspect_memory(paths=[str(d)])
    assert [s.rank for s in report.snapshots] == [0, 1, 2]
    imb = [f for f in report.findings if f.kind == "rank_memory_imbalance"]
    assert len(imb) == 1 and imb[0].ranks == [2]
    assert imb[0].facts["ranks"]["2"]["bytes"] == 4 * GiB
    assert imb[0].facts["ranks"]["2"]["others_median"] == 1 * GiB
    assert report.snapshots[2].top_sites[0].site == f"{TRAIN}:61 in log_full_batch"


def test_answer_is_bounded_to_top_n(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    for i in range(30):
        b.alloc((i + 1) * MiB, user_frames(TRAIN, 100 + i, "make"))
    report = api.inspect_memory(paths=[str(b.dump(tmp_path / "s_rank0.pickle"))], top=5)
    s = report.snapshots[0]
    assert len(s.top_sites) == 5
    assert s.top_sites[0].live_bytes == 30 * MiB
    assert s.other_sites == 25
    assert s.other_sites_bytes == sum(range(1, 26)) * MiB
    assert report.truncated and report.hint


def test_legacy_block_history_and_expandable_settings(tmp_path: Path) -> None:
    b = SnapshotBuilder(expandable_segments=True)
    b.alloc(4 * MiB, user_frames(TRAIN, 3, "old"))
    data: dict[str, Any] = b.build()
    for seg in data["segments"]:  # the pre-2.1 layout: frames under history[0]
        for blk in seg["blocks"]:
            frames = blk.pop("frames")
            blk["history"] = [{"addr": blk["address"], "real_size": blk["size"], "frames": frames}]
    s = analyze_snapshot(data, "legacy")
    assert s.top_sites[0].site == f"{TRAIN}:3 in old"
    assert s.expandable_segments is True
    assert s.allocator_settings == "expandable_segments:True"


def test_snapshot_without_frames_says_how_to_record_them(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.alloc(4 * MiB, [])
    report = api.inspect_memory(paths=[str(b.dump(tmp_path / "snapshot-rank1.pickle"))])
    assert report.snapshots[0].has_frames is False
    f = next(f for f in report.findings if f.kind == "snapshot_without_frames")
    assert "_record_memory_history" in f.fix


def test_not_a_snapshot_and_missing_paths(tmp_path: Path) -> None:
    other = tmp_path / "model.pickle"
    other.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    with pytest.raises(SnapshotUnreadable, match="not a memory snapshot"):
        load_snapshot(other)
    with pytest.raises(InvalidInput, match="no such file"):
        api.inspect_memory(paths=[str(tmp_path / "nope.pickle")])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidInput, match="holds no snapshot files"):
        api.inspect_memory(paths=[str(empty)])
    with pytest.raises(InvalidInput, match="either a pid or snapshot paths"):
        api.inspect_memory(pid=1, paths=[str(other)])


def test_rank_from_filename() -> None:
    assert rank_from_filename("snapshot-rank12.pickle") == 12
    assert rank_from_filename("oom_rank_3_step100.pkl") == 3
    assert rank_from_filename("mem_r7.pickle") == 7
    assert rank_from_filename("snapshot_1234.pickle") is None
    assert rank_from_filename("5.pickle", loose=True) == 5


def test_parsers_of_proc_and_nvidia_smi() -> None:
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nRssShmem:\t    2048 kB\nThreads:\t4\n"
    assert parse_kb_fields(status) == {"VmHWM": 200 * MiB, "VmRSS": 100 * MiB, "RssShmem": 2 * MiB}
    smi = "4242, 40536, GPU-1f2e\n4243, [N/A], GPU-1f2e\n4244, 512, GPU-9a9a\n"
    assert parse_nvidia_smi_apps(smi) == {4242: [("GPU-1f2e", 40536 * MiB)], 4244: [("GPU-9a9a", 512 * MiB)]}


def test_mcp_inspect_memory_in_memory(tmp_path: Path) -> None:
    path = fragmented(tmp_path)

    async def go() -> tuple[Any, Any, Any]:
        async with Client(build_server()) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            ok = await client.call_tool("inspect_memory", {"paths": [str(path)], "top": 3})
            bad = await client.call_tool("inspect_memory", {"paths": [str(tmp_path / "missing.pickle")]})
            return tools, ok, bad

    tools, ok, bad = anyio.run(go)
    assert tools["inspect_memory"].annotations.read_only_hint is True
    assert tools["inspect_memory"].output_schema is not None
    assert "memory_budget" in tools
    assert not ok.is_error
    assert ok.structured_content["snapshots"][0]["fragmentation"]["kind"] == "fragmentation"
    assert bad.is_error
    assert "Fix:" in bad.content[0].text


def test_pending_free_blocks_keep_the_replay_consistent() -> None:
    """A block freed on another stream is 'active_pending_free' until free_completed: the trace still counts it."""
    b = SnapshotBuilder()
    b.alloc(10 * MiB, user_frames(TRAIN, 1, "a"))
    side = b.alloc(30 * MiB, user_frames(TRAIN, 2, "b"))
    data = b.build()
    for seg in data["segments"]:
        for blk in seg["blocks"]:
            if blk["address"] == side:
                blk["state"] = "active_pending_free"
    data["device_traces"][0].append(
        {"action": "free_requested", "addr": side, "size": 30 * MiB, "stream": 0, "frames": []}
    )
    s = analyze_snapshot(data, "pending")
    assert (s.allocated_bytes, s.pending_free_bytes) == (10 * MiB, 30 * MiB)
    assert s.peak_allocated_bytes == 40 * MiB
    assert [t.site for t in s.top_sites] == [f"{TRAIN}:1 in a"]
