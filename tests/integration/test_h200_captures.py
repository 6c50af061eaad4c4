"""Real output of a real GPU (tests/data/h200, README there): an NCCL stall before its watchdog,
and an OOM whose kept blocks come from another script line than the training forward. CI has no
GPU, so these captures stand in for it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rankscope.capabilities.judge import judge_look
from rankscope.capabilities.saved_stacks import stacks_from_files
from rankscope.capabilities.triage import triage_logs
from rankscope.models.look import HostLook
from tests.paths import DATA

H200 = DATA / "h200"
STALL = H200 / "watch_stall_nccl"


def test_saved_native_dumps_of_the_nccl_stall_name_rank_2_and_its_guard() -> None:
    """Rank 2 blocks opening a FIFO (w_stall.py:16, guarded at :13); ranks 0, 1, 3 enqueued the
    all_reduce and their CPUs wait for the GPU in `loss.item()`."""
    report = stacks_from_files(sorted(str(p) for p in (STALL / "a1").glob("pyspy_native_rank*.json")))
    v = report.verdict
    assert v.kind == "divergent_ranks" and v.suspect_ranks == [2]
    assert "w_stall.py:16" in v.summary and "wait for the GPU at w_stall.py:38" in v.summary


def test_the_look_a_watch_keeps_judges_as_the_live_call_did() -> None:
    """look.json is `stacks --local --json` taken 3 s into the stall: judged again, away from the
    job, it gives the verdict the live call gave then, guard included (the look carries the source
    lines it needs)."""
    look = HostLook.model_validate_json((STALL / "a1" / "look.json").read_text())
    live = json.loads((STALL / "a1" / "stacks.json").read_text())["verdict"]
    v = judge_look(look).verdict
    assert (v.kind, v.suspect_ranks) == (live["kind"], live["suspect_ranks"]) == ("divergent_ranks", [2])
    assert "`if rank == 2 and step == STALL_STEP:` guards the call at w_stall.py:16" in " ".join(v.evidence)


def test_oom_names_the_evaluation_that_keeps_its_graphs(tmp_path: Path) -> None:
    """The training forward (train.py:24) and evaluate() (train.py:10, called at :29) reach the
    same library line; only the evaluation's outputs stay, appended with their graphs at :11."""
    src = H200 / "oom_eval_kept"
    for name in (
        "train.py",
        "model.py",
        "train.log",
        "snapshot_rank0_step40.pickle",
        "snapshot_rank0_oom.pickle",
    ):
        shutil.copy(src / name, tmp_path / name)
    report = triage_logs([str(tmp_path)])
    leak = next(f for f in report.findings if f.kind == "memory_leak")
    assert leak.ranks == [0]
    assert leak.facts["script"].endswith("train.py:10 in evaluate")
    assert leak.facts["caller"].endswith("train.py:29 in main")
    assert "`history.append(scores)`" in (leak.fix or "")
    assert "no_grad" in (leak.fix or "") and "train.py:24" not in leak.message


def test_saved_stacks_of_ranks_that_never_got_past_start_up_are_a_start_up() -> None:
    """Ranks 0-2 of WORLD_SIZE=4 (rank 3 never started) under NCCL: rank 0's store waits for the
    world to connect, ranks 1-2 for rank 0's NCCL id, whether the communicator is made at the first
    all_reduce (lazy) or in init_process_group (eager, device_id). Never a mismatched collective."""
    for mode in ("lazy", "eager"):
        files = sorted(str(p) for p in (H200 / f"init_{mode}_nccl").glob("pyspy_native_rank*.json"))
        v = stacks_from_files(files).verdict
        assert v.kind == "startup" and v.confidence == "medium", mode
        assert "rank 0's store still waits for ranks of the world to connect" in v.summary
        assert "rank 0 waits in init_process_group: the store waiting" in v.evidence[0]
        assert "ranks 1-2 wait in" in v.evidence[1] and "broadcastUniqueNCCLID" in v.evidence[1]


def test_the_real_watch_folder_of_an_nccl_job_restarted_once_names_rank_2_per_attempt(tmp_path: Path) -> None:
    """`rankscope watch` beside the NCCL job of scripts/run2.sh (torchrun --max-restarts=1): it read
    the 30 s timeout from the script, captured each attempt's stall 16-20 s in, before the watchdog,
    and the morning after triage leads with that capture, when it was taken, and each attempt."""
    folder = tmp_path / "watch"
    shutil.copytree(H200 / "watch_folder_nccl" / "watch", folder)
    report = triage_logs([str(folder)])
    assert report.suspect_ranks == [2] and report.victim_ranks == [0, 1, 3]
    assert report.summary.startswith("From the watch's capture (incident 002-")
    assert "attempt 2 of 2, captured 74 s before the job ended" in report.summary
    assert "rank 2 is in no collective, at w_stall.py:16" in report.summary
    assert not any(s.skipped for s in report.sources)


def test_the_nccl_log_alone_names_the_rank_that_never_issued_the_collective(tmp_path: Path) -> None:
    """Ranks 0, 1, 3 time out on all_reduce #161 with the same counts; rank 2 reports no timeout and
    its dump-signal line says its last enqueued work is #160: it fell behind. The log's verdict must
    not also say that no rank fell behind."""
    shutil.copy(STALL / "torchrun.log", tmp_path / "torchrun.log")
    report = triage_logs([str(tmp_path)])
    assert report.suspect_ranks == [2] and report.victim_ranks == [0, 1, 3]
    assert "no rank fell behind" not in report.summary
    assert [s.path for s in report.sources if s.skipped] == []
