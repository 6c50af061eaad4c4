"""The one memory finding of a set of snapshots, and a dead OOM job's folder read in one triage call.

Each pattern has its own fix: a leak (kept every Nth, or growing from one snapshot of a rank to the
next) is fixed by not keeping the tensors, one rank above the others by moving its own work, a plan at
the limit on every rank by memory_budget, fragmentation (only when the numbers at the failure say so)
by expandable_segments.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from rankscope import api
from rankscope.analysis.memory import analyze_snapshot, diagnose, fragmentation
from rankscope.analysis.memory.snapshot import kept_every, ordinal
from rankscope.capabilities.triage import kind_of, triage_logs
from tests.paths import DATA
from tests.snapshot_builder import GiB, MiB, SnapshotBuilder, real_frames, user_frames, write_leak_job
from tests.unit.test_memory_snapshots import fragmented

LEAK_JOB = DATA / "postmortem" / "oom_leak"
TRAIN = "/work/job/train.py"
MODEL = "/work/job/model.py"


def test_dead_oom_folder_in_one_triage_call() -> None:
    """Rank 3 keeps a view of every 10th step's logits: the snapshots name the rank, the kept site with
    its script line, the leak and its every-Nth pattern; the fix is not to shard more."""
    r = triage_logs([str(LEAK_JOB)])
    assert r.suspect_ranks == [3] and r.decided_by == "memory_snapshots"
    assert "Leak on rank 3" in r.summary
    assert "/workspace/lm/model.py:48 in forward <- /workspace/lm/train.py:77 in main" in r.summary
    assert "every 10th" in r.summary and "the other ranks hold none of it" in r.summary
    assert "holds 21.5 GiB in 11 blocks at the OOM" in r.summary
    assert "11.7 GiB in 6 blocks" in r.summary  # the step-50 snapshot of the same rank
    lead = r.findings[0]
    assert lead.kind == "memory_leak" and lead.ranks == [3]
    assert lead.facts["kept_every"] == 10 and lead.facts["script"] == "/workspace/lm/train.py:77 in main"
    fix = r.next_steps[0].action
    # the statement that keeps them, read in train.py beside the snapshots, and its own remedy
    keeps = "/workspace/lm/train.py:82 `last_token_logits.append(logits[:, -1])`"
    assert lead.facts["keeps"] == [keeps] and f"kept by {keeps}" in r.summary
    assert fix == f"Fix: {lead.fix}" and fix.startswith(f"Fix: {keeps} in main keeps every 10th tensor")
    assert "`logits[:, -1].detach().cpu()`" in fix and "shard" not in fix and "expandable_segments" not in fix
    assert "graph" not in r.summary  # its activations were freed by backward: only the logits are kept
    oom = next(f for f in r.findings if f.kind == "cuda_oom")
    assert "memory_leak" in (oom.fix or "")  # the OOM line's generic advice gives way
    assert r.playbook == "skill/oom.md#leak"
    snaps = [s for s in r.sources if s.kind == "memory_snapshot"]
    assert len(snaps) == 5 and not any(s.skipped for s in snaps)
    assert not any(s.path.endswith(".py") for s in r.sources)  # the job's code is not a log


def test_the_folder_snapshots_are_what_the_builder_makes(tmp_path: Path) -> None:
    """The committed snapshots are the builder's output, so a change to either shows here."""
    for path in write_leak_job(tmp_path):
        assert path.read_bytes() == (LEAK_JOB / path.name).read_bytes(), path.name


def test_real_layout_puts_the_script_line_beside_the_site() -> None:
    b = SnapshotBuilder()
    stack = real_frames((MODEL, 48, "forward"), (TRAIN, 77, "main"), (TRAIN, 99, "<module>"))
    b.alloc(64 * MiB, stack)
    own = real_frames((TRAIN, 12, "main"), (TRAIN, 99, "<module>"))
    b.alloc(32 * MiB, own)
    s = analyze_snapshot(b.build(), "x")
    assert [(t.site, t.script) for t in s.top_sites] == [
        (f"{MODEL}:48 in forward", f"{TRAIN}:77 in main"),
        (f"{TRAIN}:12 in main", None),  # the site is the script's own line
    ]


def test_kept_every_nth() -> None:
    freed = [i % 10 != 0 for i in range(51)]
    assert kept_every(freed) == 10
    assert kept_every([*freed, False]) == 10  # the allocation of the step in flight
    assert kept_every([*freed, True, False, False]) == 10  # two of them
    assert kept_every([*freed[:-1], False, False, False, False]) is None  # three more kept: not in flight
    assert kept_every([i % 4 != 1 for i in range(20)]) == 4
    assert kept_every([False] * 10) is None  # nothing freed: a steady leak, not every Nth
    assert kept_every([True] * 10) is None
    assert kept_every([i not in (0, 3, 9) for i in range(12)]) is None  # no stride
    assert kept_every([i % 10 != 0 for i in range(15)]) is None  # two kept: too few to say


def _rank(folder: Path, rank: int, extra: int = 0, oom: bool = False, base: int = 10 * GiB) -> None:
    b = SnapshotBuilder()
    b.alloc(base, user_frames(MODEL, 20, "__init__"))
    for _ in range(4):
        act = b.alloc(2 * GiB, user_frames(MODEL, 30, "forward"))
        b.free(act)
    for step in range(30):  # a small metric tensor kept every 10th step: real, but not what fills the GPU
        metric = b.alloc(4 * MiB, user_frames(TRAIN, 90, "log_metrics"))
        if step % 10:
            b.free(metric)
    if extra:
        b.alloc(extra, user_frames(TRAIN, 61, "log_full_batch"))
    if oom:
        b.oom(4 * GiB, device_free=100 * MiB, frames=user_frames(MODEL, 30, "forward"))
    b.dump(folder / f"snapshot-rank{rank}.pickle")


def test_one_rank_above_the_others_is_rank_only_work(tmp_path: Path) -> None:
    for rank in range(4):
        _rank(tmp_path, rank, extra=6 * GiB if rank == 2 else 0, oom=rank == 2)
    report = api.inspect_memory(paths=[str(tmp_path)])
    lead = report.findings[0]
    assert lead.kind == "memory_rank_only" and lead.ranks == [2]
    assert lead.facts["site"] == f"{TRAIN}:61 in log_full_batch"
    assert "if rank == 0" in (lead.fix or "") and "shard" not in (lead.fix or "")


def test_every_rank_near_the_limit_cannot_fit(tmp_path: Path) -> None:
    for rank in range(4):
        _rank(tmp_path, rank, base=(70 + rank) * GiB, oom=rank == 1)
    report = api.inspect_memory(paths=[str(tmp_path)])
    lead = report.findings[0]
    assert lead.kind == "memory_cannot_fit" and lead.ranks == [1]
    small = report.snapshots[1].leak_suspects[0]
    assert (small.site, small.kept_every) == (f"{TRAIN}:90 in log_metrics", 10)  # found, but does not lead
    assert lead.next_steps[0].tool == "memory_budget"
    assert "4 ranks" in lead.message


def test_one_rank_alone_is_exhaustion_that_asks_for_another_rank(tmp_path: Path) -> None:
    _rank(tmp_path, 0, oom=True)
    lead = api.inspect_memory(paths=[str(tmp_path)]).findings[0]
    assert lead.kind == "memory_exhaustion"
    assert "another rank" in (lead.fix or "")


def test_fragmentation_only_when_the_numbers_at_the_failure_say_so(tmp_path: Path) -> None:
    lead = api.inspect_memory(paths=[str(fragmented(tmp_path))]).findings[0]
    assert lead.kind == "memory_fragmentation" and "expandable_segments:True" in (lead.fix or "")
    # free pieces add up to the request, but reserved is barely above allocated: not fragmentation
    frag = fragmentation(
        reserved=1000 * MiB,
        allocated=900 * MiB,
        free_blocks=[(10 * MiB, "large")] * 10,
        failed_request=20 * MiB,
    )
    assert frag.kind == "exhaustion"


def test_growth_between_two_snapshots_of_a_rank_is_a_leak_without_a_trace(tmp_path: Path) -> None:
    """Traces off (segments only): the same site holds more blocks in the later snapshot of the rank."""
    b = SnapshotBuilder()
    b.alloc(2 * GiB, user_frames(MODEL, 20, "__init__"))
    for step in range(12):
        b.alloc(512 * MiB, user_frames(TRAIN, 88, "train_step"))  # a loss history kept with its graph
        if step == 3:
            early: dict[str, Any] = b.build()
    late = b.build()
    b.oom(1 * GiB, device_free=0)
    for name, data in (("a", early), ("b", late)):
        data["device_traces"] = []
        (tmp_path / f"snapshot-rank1-{name}.pickle").write_bytes(pickle.dumps(data))
    report = api.inspect_memory(paths=[str(tmp_path)])
    lead = report.findings[0]
    assert lead.kind == "memory_leak" and lead.ranks == [1]
    assert lead.facts["site"] == f"{TRAIN}:88 in train_step" and lead.facts["blocks"] == 12
    assert "it held 2.0 GiB in 4 blocks" in lead.message
    assert diagnose(report.snapshots) == lead


class _Evil:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (self.target,))


def test_a_pickle_that_runs_code_is_refused_in_a_folder(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    job = tmp_path / "job"
    job.mkdir()
    evil = job / "snapshot-rank0.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": _Evil(str(target))}))
    assert kind_of(evil) == "memory_snapshot"
    (job / "train.log").write_text("[rank0]: step 1\n")
    r = triage_logs([str(job)])
    src = next(s for s in r.sources if s.kind == "memory_snapshot")
    assert src.skipped and "refusing to load posix.mkdir" in src.skipped
    assert not target.exists()


def test_every_nth_kept_is_found_when_the_windows_do_not_grow_steadily() -> None:
    """A step's own big temporary at the same line makes the live bytes dip at some window ends: the
    steady-growth rule misses the site, the trace's every-Nth pattern does not."""
    b = SnapshotBuilder()
    for step in range(40):
        kept = b.alloc(100 * MiB, user_frames(TRAIN, 5, "step"))
        b.free(b.alloc(300 * MiB, user_frames(TRAIN, 5, "step")))
        if step % 10:
            b.free(kept)
    (leak,) = analyze_snapshot(b.build(), "x").leak_suspects
    assert (leak.kept_every, leak.kept, leak.allocs, leak.windows_grown) == (20, 4, 80, 0)


def test_a_leak_without_an_oom_does_not_take_over_a_crash(tmp_path: Path) -> None:
    """Snapshots that show a leak but no OOM, beside a log of another failure: the log keeps its
    suspect, the leak is a line of evidence."""
    b = SnapshotBuilder()
    for step in range(40):
        b.alloc(16 * MiB, user_frames(TRAIN, 88, "train_step"))
        b.free(b.alloc(64 * MiB, user_frames(MODEL, 30, "forward")))
        assert step >= 0
    b.dump(tmp_path / "snapshot-rank0.pickle")
    log = DATA / "logs" / "nccl_watchdog_lagging_rank.log"
    (tmp_path / log.name).write_bytes(log.read_bytes())
    r = triage_logs([str(tmp_path)])
    assert r.suspect_ranks == [2] and r.decided_by != "memory_snapshots"
    assert not r.summary.startswith("From the memory snapshots")
    assert any(e.startswith("memory snapshots: Leak on rank 0") for e in r.evidence)
    assert r.findings[-1].kind == "memory_leak" and r.findings[0].kind != "memory_leak"


def test_one_request_larger_than_the_gpu_is_not_a_plan_problem(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.alloc(2 * GiB, user_frames(MODEL, 20, "__init__"))
    b.oom(9000 * GiB, device_free=70 * GiB, frames=user_frames(TRAIN, 6, "main"))
    lead = api.inspect_memory(paths=[str(b.dump(tmp_path / "snapshot-rank0.pickle"))]).findings[0]
    assert lead.kind == "memory_exhaustion" and "exceeds all the GPU memory" in lead.message
    assert f"{TRAIN}:6 in main" in lead.message and "shape" in (lead.fix or "")


def test_snapshots_in_torchrun_rank_folders_take_the_folder_rank(tmp_path: Path) -> None:
    for rank in range(2):
        folder = tmp_path / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        _rank(folder, rank, extra=6 * GiB if rank == 1 else 0, oom=rank == 1)
        (folder / f"snapshot-rank{rank}.pickle").rename(folder / "oom.pickle")
    r = triage_logs([str(tmp_path)])
    assert r.suspect_ranks == [1] and r.findings[0].kind == "memory_rank_only"
    assert sorted(s.rank_hint for s in r.sources if s.kind == "memory_snapshot") == [0, 1]


def test_ordinals() -> None:
    assert [ordinal(n) for n in (2, 3, 4, 10, 11, 12, 13, 21, 22, 101, 111)] == [
        "2nd",
        "3rd",
        "4th",
        "10th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
        "111th",
    ]


def test_a_leak_on_every_rank_names_every_rank(tmp_path: Path) -> None:
    """Code every rank runs leaks on every rank: the finding does not single out the first one."""
    for rank in range(3):
        b = SnapshotBuilder()
        for _ in range(40):
            b.alloc(64 * MiB, user_frames(TRAIN, 88, "train_step"))  # a loss history kept with its graph
            b.free(b.alloc(256 * MiB, user_frames(MODEL, 30, "forward")))
        b.dump(tmp_path / f"snapshot-rank{rank}.pickle")
    lead = api.inspect_memory(paths=[str(tmp_path)]).findings[0]
    assert lead.kind == "memory_leak" and lead.ranks == [0, 1, 2]
    assert "every rank runs it" in lead.message
