"""A dead job in one call: watchdog logs read right, real texts from an H200, and a folder of
leftovers (log, recorder dumps, saved stacks) read together and each alone."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from rankscope.analysis.sizing.bound import bound_triage
from rankscope.analysis.sizing.fit import size_of
from rankscope.capabilities.triage import kind_of, triage_logs
from rankscope.render.answer import shape_answer
from tests.paths import DATA

LOGS = DATA / "logs"
WATCHDOG = LOGS / "watchdog"
H200 = LOGS / "h200"
POST = DATA / "postmortem"


def _evidence(r: object) -> str:
    return "\n".join(r.evidence)


# -- watchdog logs -------------------------------------------------------------------------------------


def test_torch_211_lagging_rank_is_named_with_the_difference_in_counts() -> None:
    """Rank 1 skipped a step: it timed out on #797 with NumelIn=1 (its barrier) and last enqueued #797;
    the others on #797 with NumelIn=65536 and last enqueued #801. Ranks 0, 1 and 3 died of SIGABRT."""
    r = triage_logs([str(WATCHDOG / "torch211_skipped_step.log")])
    assert r.suspect_ranks == [1] and r.victim_ranks == [0, 2, 3]
    timeouts = {f.ranks[0]: f for f in r.findings if f.kind == "collective_timeout"}
    one = timeouts[1].facts
    assert (one["seq"], one["op"], one["numel_in"], one["last_enqueued"], one["last_completed"]) == (
        797,
        "ALLREDUCE",
        1,
        797,
        796,
    )
    assert timeouts[0].facts["last_enqueued"] == 801 and timeouts[0].facts["numel_in"] == 65536
    assert (
        "rank 1 enqueued 4 fewer collectives than ranks 0,2-3 (last enqueued #797, theirs #801)" in r.summary
    )
    assert "NumelIn=1 where ranks 0,2-3 wait in ALLREDUCE NumelIn=65536" in r.summary
    assert r.evidence[0].startswith("rank 1: enqueued 4 fewer collectives")  # the suspect's evidence leads
    assert "rank 0: aborted (SIGABRT) by NCCL's watchdog" in _evidence(r)  # a consequence, not a suspect
    assert (
        "torchrun named rank 0 as the first observed failure (exitcode -6, SIGABRT): the first to exit"
        in _evidence(r)
    )
    assert r.playbook == "skill/communication-errors.md#collective-timeout"


def test_torch_213_size_mismatch_at_the_same_sequence_number() -> None:
    r = triage_logs([str(WATCHDOG / "torch213_size_mismatch.log")])
    assert r.suspect_ranks == [2] and r.victim_ranks == [0, 1, 3]
    assert (
        "rank 2 waits at #412 in ALLREDUCE NumelIn=4096 where ranks 0-1,3 wait in ALLREDUCE NumelIn=8192"
        in (r.summary)
    )


def test_every_rank_behind_the_same_sequence_number_names_nobody() -> None:
    r = triage_logs([str(WATCHDOG / "torch213_all_same.log")])
    assert r.suspect_ranks == []
    assert "timed out in the same ALLREDUCE NumelIn=65536 #21 with the same last enqueued #44" in r.summary
    assert "the logs name no suspect" in r.summary
    assert not any("first observed failure with exitcode" in e for e in r.evidence)  # rank 0 is not blamed


def test_bounded_answer_keeps_the_suspects_finding_and_the_contrast() -> None:
    r = bound_triage(triage_logs([str(WATCHDOG / "torch211_skipped_step.log")]))
    ranks = [f.ranks for f in r.findings if f.kind == "collective_timeout"]
    assert [1] in ranks and len(ranks) >= 2  # rank 1's own finding and one victim's to compare with
    text, data = shape_answer(r)
    assert "4 fewer collectives" in text and size_of(data) <= 8 * 1024


def test_sigabrt_without_any_watchdog_line_is_still_a_cause() -> None:
    log = "[rank2]: terminate called after throwing an instance of 'c10::Error'\nSignal 6 (SIGABRT) received by PID 77\n"
    r = triage_logs([], text=log)
    assert any(f.kind == "killed_by_signal" and f.facts["signal"] == "SIGABRT" for f in r.findings)
    assert not any("a consequence" in e for e in r.evidence)


def test_monitored_barrier_names_the_ranks_that_did_not_arrive_not_rank_0() -> None:
    log = (
        "[rank0]: RuntimeError: [Rank 0]: Rank 2 failed to pass monitoredBarrier in 1800000 ms\n"
        "[rank1]: RuntimeError: Rank 1 successfully reached monitoredBarrier, but received errors while "
        "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n"
    )
    r = triage_logs([], text=log)
    assert r.suspect_ranks == [2]
    assert "rank 2: did not reach the monitored barrier (rank 0 names it)" in r.evidence


def test_detail_mismatch_where_only_some_ranks_report_names_the_rank_they_name() -> None:
    def line(me: int, other: int, shape: str, other_shape: str) -> str:
        return (
            f"[rank{me}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {me} is running "
            f"collective: CollectiveFingerPrint(SequenceNumber=5, OpType=ALLREDUCE, TensorShape={shape}, "
            f"TensorDtypes=Float), but Rank {other} is running collective: CollectiveFingerPrint(SequenceNumber=5, "
            f"OpType=ALLREDUCE, TensorShape={other_shape}, TensorDtypes=Float)."
        )

    r = triage_logs([], text="\n".join([line(0, 2, "[4]", "[8]"), line(1, 2, "[4]", "[8]")]))
    assert r.suspect_ranks == [2]
    only_one = triage_logs([], text=line(0, 2, "[4]", "[8]"))  # e.g. torchrun kept the first error only
    assert only_one.suspect_ranks == [2]
    each_other = triage_logs([], text="\n".join([line(0, 1, "[4]", "[8]"), line(1, 0, "[8]", "[4]")]))
    assert sorted(each_other.suspect_ranks) == [0, 1]  # two ranks: either may be the odd one


# -- real texts (H200, torch 2.11.0+cu130, NCCL 2.28.9) ------------------------------------------------------


def test_real_duplicate_gpu_is_a_device_mapping_error_with_the_one_gpu_per_rank_fix() -> None:
    r = triage_logs([str(H200 / "duplicate_gpu.log")])
    dup = [f for f in r.findings if f.kind == "duplicate_gpu"]
    assert sorted(f.ranks[0] for f in dup) == [0, 1]
    assert dup[0].facts["bus_id"] == "60" and "torch.cuda.set_device" in dup[0].fix
    assert "Xid" not in dup[0].fix
    assert not any(f.message == "NCCL warning: CUDA failure" for f in r.findings)
    assert sorted(r.suspect_ranks) == [0, 1]
    assert r.summary.startswith("Two ranks share one GPU")
    assert r.playbook == "skill/communication-errors.md#gpu-shared"


def test_real_device_assert_quotes_the_assertion_and_names_the_kernel() -> None:
    r = triage_logs([str(H200 / "device_assert.log")])
    (a,) = [f for f in r.findings if f.kind == "device_assert"]
    assert a.facts["reason"] == "index out of bounds"
    assert a.facts["kernel_site"] == "IndexKernel.cu:111 operator()"
    assert '"index out of bounds"' in a.facts["assertion"]
    (cuda,) = [f for f in r.findings if f.kind == "cuda_error"]
    assert cuda.facts["call_site"] == "/workspace/c_errors.py:10 in <module>" and "Xid" not in cuda.fix
    assert "index out of bounds" in r.summary and r.playbook == "skill/crashes.md#device-side-assert"


def test_real_dead_reader_thread_is_a_finding() -> None:
    r = triage_logs([str(H200 / "loader_hang_torchrun.log")])
    (t,) = [f for f in r.findings if f.kind == "thread_died"]
    assert t.facts["thread"] == "shard-reader" and t.facts["exception"] == "ValueError"
    assert t.facts["exception_message"] == "corrupt record in shard-00003"
    assert t.facts["call_site"] == "/workspace/s2_loader.py:14 in _read"
    assert "Thread shard-reader died: ValueError: corrupt record in shard-00003" in r.summary
    assert any(f.kind == "launcher_stopped" for f in r.findings)


def test_real_oom_still_reads_as_oom() -> None:
    r = triage_logs([str(H200 / "oom.log")])
    assert "cuda_oom" in r.kinds and "Xid" not in r.summary


# -- a folder of leftovers -----------------------------------------------------------------------------------


def test_gpu_stuck_folder_together_the_recorder_decides() -> None:
    r = triage_logs([str(POST / "gpu_stuck")])
    assert r.decided_by == "flight_recorder" and r.suspect_ranks == [0]
    assert r.flight is not None and r.flight.kind == "divergent_ranks"
    assert r.stacks is not None  # every CPU waits for its GPU: the stacks alone cannot tell
    assert r.summary.startswith("From the flight recorder: rank 0's GPU never started nccl:all_reduce #21")
    assert "torchrun was stopped from outside" in r.summary
    kinds = {Path(s.path).name: s.kind for s in r.sources}
    assert kinds["s3_rank_0"] == "flight_dump" and kinds["pyspy_native_rank0.json"] == "saved_stacks"
    assert kinds["torchrun.log"] == "file"


def test_gpu_stuck_each_source_alone() -> None:
    fr = triage_logs([str(POST / "gpu_stuck" / "fr")])
    assert fr.suspect_ranks == [0] and fr.decided_by == "flight_recorder"
    log = triage_logs([str(POST / "gpu_stuck" / "torchrun.log")])
    assert log.suspect_ranks == [] and log.decided_by is None and log.flight is None
    assert log.playbook == "skill/crashes.md#dead-job"
    stacks = triage_logs([str(p) for p in sorted((POST / "gpu_stuck").glob("pyspy_native_rank*.json"))])
    assert stacks.decided_by == "stacks" and stacks.suspect_ranks == []
    assert stacks.stacks is not None and stacks.summary.startswith("From the saved stacks:")


def test_loader_hang_folder_the_stacks_name_the_rank_the_log_cannot() -> None:
    """The log has the dead thread's traceback but no rank prefix; the stacks show rank 3 in Queue.get."""
    r = triage_logs([str(POST / "loader_hang")])
    assert r.decided_by == "stacks" and r.suspect_ranks == [3]
    # the dead thread leads: whose it most likely was, its error and line, what the rank waits in
    assert r.summary.startswith("A thread died, most likely rank 3's (the one the saved stacks single out)")
    assert "ValueError: corrupt record in shard-00003" in r.summary and "Queue.get" in r.summary
    assert r.summary.count("shard-reader died") == 1  # the logs' sentence is not said again
    assert any(f.kind == "thread_died" for f in r.findings)
    # the first step is the fix; nothing asks to dump the dead job again or repro "the last stacks"
    assert r.next_steps[0].action.startswith("Fix: the exception (at ")
    assert "get(timeout=...)" in r.next_steps[0].action
    assert all(s.tool != "dump_stacks" and not (s.args or {}).get("from_last_stacks") for s in r.next_steps)
    assert r.playbook == "skill/crashes.md#thread-died"


def test_recorder_outranks_the_log_where_they_disagree(tmp_path: Path) -> None:
    shutil.copy(LOGS / "cuda_oom.log", tmp_path / "job.log")  # the log blames rank 3
    shutil.copytree(POST / "gpu_stuck" / "fr", tmp_path / "fr")
    r = triage_logs([str(tmp_path)])
    assert r.decided_by == "flight_recorder" and r.suspect_ranks == [0]
    assert "the logs named rank 3; the flight recorder outranks them here" in r.evidence


def test_watchdog_log_with_the_skip_step_dumps_tells_the_story_from_both(tmp_path: Path) -> None:
    shutil.copy(WATCHDOG / "torch211_skipped_step.log", tmp_path / "torchrun.log")
    shutil.copytree(DATA / "flight" / "nccl_skip_step", tmp_path / "dumps")
    r = triage_logs([str(tmp_path)])
    assert r.decided_by == "flight_recorder" and r.suspect_ranks == [1]
    assert "rank 1 recorded 4 fewer nccl:all_reduce" in r.summary and "one step's worth" in r.summary
    assert "rank 1 enqueued 4 fewer collectives" in r.summary  # the log's own story, after it
    bounded = bound_triage(r)
    assert bounded.flight is not None and bounded.flight.evidence == []  # already in evidence above
    assert any(e.startswith("flight recorder: ") for e in bounded.evidence)


def test_files_are_sorted_by_their_first_bytes(tmp_path: Path) -> None:
    (tmp_path / "trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": []}))
    (tmp_path / "fr_rank_1.json").write_text(json.dumps({"version": "2.10", "pg_config": {}, "entries": []}))
    (tmp_path / "error.json").write_text(json.dumps({"message": "boom"}))
    (tmp_path / "stacks.json").write_text(json.dumps({"verdict": {"kind": "inconclusive"}}))
    (tmp_path / "dump_rank2.json").write_text("[]")
    (tmp_path / "dump_rank3.txt").write_text("Process 12: python train.py\nPython v3.12.3\n")
    (tmp_path / "train.log").write_text("step 1\n")
    kinds = {p.name: kind_of(p) for p in tmp_path.iterdir()}
    assert kinds == {
        "trace_rank_0": "flight_dump",
        "fr_rank_1.json": "flight_dump",
        "error.json": "error_json",
        "stacks.json": "answer",
        "dump_rank2.json": "saved_stacks",
        "dump_rank3.txt": "saved_stacks",
        "train.log": "file",
    }


@pytest.mark.parametrize("name", ["torch211_skipped_step.log", "torch213_size_mismatch.log"])
def test_watchdog_answers_stay_small(name: str) -> None:
    text, data = shape_answer(bound_triage(triage_logs([str(WATCHDOG / name)])))
    assert size_of(data) <= 6144 and len(text.encode()) <= 4096  # 4 ranks of watchdog counts


def _timeout(rank: int, seq: int, enqueued: int, numel: int = 65536) -> str:
    return (
        f"[rank{rank}]:[E1126 09:11:05.100000000 ProcessGroupNCCL.cpp:757] [Rank {rank}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, "
        f"Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
        f"[rank{rank}]:[E1126 09:11:05.200000000 ProcessGroupNCCL.cpp:2395] [PG ID 0 PG GUID 0(default_pg) Rank "
        f"{rank}]  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {enqueued}, "
        f"last completed work: {seq - 1}\n"
    )


def _abort_table(ranks: range, first: int) -> str:
    rows = [
        f"[{r}]:\n  time      : 2026-11-26_09:11:12\n  host      : node\n  rank      : {r} (local_rank: {r})\n"
        f"  exitcode  : -6 (pid: {900 + r})\n  error_file: <N/A>\n  traceback : Signal 6 (SIGABRT) received by PID {900 + r}\n"
        for r in ranks
        if r != first
    ]
    root = (
        f"[{first}]:\n  time      : 2026-11-26_09:11:12\n  host      : node\n  rank      : {first} (local_rank: {first})\n"
        f"  exitcode  : -6 (pid: {900 + first})\n  error_file: <N/A>\n  traceback : Signal 6 (SIGABRT) received by PID "
        f"{900 + first}\n"
    )
    return (
        "Failures:\n" + "".join(rows) + "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        + root
        + "============================================================\n"
    )


def test_illegal_memory_access_on_8_gpus_blames_only_the_failing_rank() -> None:
    """Rank 5 hits an illegal memory access; the other 7 time out waiting for it and every rank is
    aborted; torchrun's first observed failure is rank 0. Rank 0 is no extra suspect."""
    log = "".join(_timeout(r, 100, 101) for r in range(8) if r != 5)
    log += (
        "[rank5]:[E1126 09:11:04.000000000 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 5] Process "
        "group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
    )
    r = triage_logs([], text=log + _abort_table(range(8), 0))
    assert r.suspect_ranks == [5]
    assert 0 in r.victim_ranks


def test_watchdog_timeout_on_8_gpus_blames_the_rank_behind_not_rank_0() -> None:
    log = "".join(_timeout(r, 78, 78 if r == 4 else 79) for r in range(8))
    r = triage_logs([], text=log + _abort_table(range(8), 0))
    assert r.suspect_ranks == [4]
    assert "rank 4 enqueued 1 fewer collective than ranks 0-3,5-7" in r.summary
