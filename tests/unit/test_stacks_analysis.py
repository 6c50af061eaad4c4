"""The pure hang analysis, replayed on py-spy JSON captured from real hung gloo jobs
(tests/data/stacks, made by tests/data/stacks/capture.py) and on stacks shaped like real
FSDP/DTensor/NCCL ones (frame names from the PyTorch source)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rankscope.analysis.hang.stacks import (
    analyze,
    find_call_site,
    is_user_frame,
    op_from_source,
    p2p_peer,
    recognise_op,
)
from rankscope.analysis.ranges import rank_ranges
from rankscope.analysis.sizing.bound import bound_report
from rankscope.capabilities.stacks import _spawn_index, _with_source_op
from rankscope.models.core import (
    Frame,
    Job,
    LocalVar,
    RankError,
    RankProcess,
    RankStack,
    StacksReport,
    ThreadStack,
)
from rankscope.render.stacks import render_stacks
from rankscope.runtime.pyspy import parse_dump
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "stacks"
SP = "/opt/venv/lib/python3.11/site-packages/"


def load(case: str) -> tuple[Job, list[RankStack], dict[str, Any]]:
    raw = json.loads((DATA / f"{case}.json").read_text())
    job = Job.model_validate(raw["job"])
    stacks = [
        RankStack(
            rank=r["rank"],
            pid=r["pid"],
            host=r["host"],
            state=r["state"],
            threads=parse_dump(r["pyspy"], r["pid"]) if r["pyspy"] else [],
        )
        for r in raw["ranks"]
    ]
    return job, stacks, raw


def report_for(case: str) -> StacksReport:
    job, stacks, _ = load(case)
    return analyze(job, stacks, [])


def by_rank(report: StacksReport) -> dict[int, RankStack]:
    return {s.rank: s for s in report.stacks if s.rank is not None}


# -- real captures -------------------------------------------------------------------------------


def test_mismatched_barrier_in_helper_vs_all_reduce_in_nested_module() -> None:
    report = report_for("mismatch_barrier")
    v = report.verdict
    assert v.kind == "mismatched_collectives"
    assert v.suspect_ranks == [2]
    assert "rank 2 waits in barrier at hang_collectives.py:" in v.summary
    assert "ranks 0-1 wait in all_reduce at hang_collectives.py:" in v.summary
    ranks = by_rank(report)
    assert ranks[2].call_site is not None and ranks[2].call_site.function == "sync_metrics"
    assert ranks[0].call_site is not None and ranks[0].call_site.function == "Reducer.forward"
    assert ranks[0].op_evidence and "torch/distributed/distributed_c10d.py" in ranks[0].op_evidence
    assert [g.ranks for g in report.groups] == [[0, 1], [2]]
    assert [g.op for g in report.groups] == ["all_reduce", "barrier"]
    # the heartbeat thread is kept but never taken for the main thread
    names = {t.name for t in ranks[0].threads}
    assert "heartbeat" in names
    assert [t.name for t in ranks[0].threads if t.is_main] == ["MainThread"]
    # the DataLoader worker is a child of rank 0, not a rank
    rank0 = next(r for r in report.job.ranks if r.rank == 0)
    assert rank0.children and all(c not in {r.pid for r in report.job.ranks} for c in rank0.children)
    assert {s.skill_section for s in v.next_steps} == {"skill/hangs.md#mismatched-collectives"}
    assert "generate_repro" in {s.tool for s in v.next_steps}


def test_native_frames_do_not_change_the_reading() -> None:
    report = report_for("mismatch_barrier_native")
    assert report.verdict.kind == "mismatched_collectives"
    assert [s.op for s in report.stacks] == ["all_reduce", "barrier"]
    assert any(f.native for s in report.stacks for t in s.threads for f in t.frames)
    # an even split has no majority: both ranks are suspects and the summary says why
    assert report.verdict.suspect_ranks == [0, 1]
    assert "no majority" in report.verdict.summary


def test_queue_blocked_rank_and_stopped_rank_are_divergent_suspects() -> None:
    report = report_for("divergent_queue_stopped")
    v = report.verdict
    assert v.kind == "divergent_ranks"
    assert v.suspect_ranks == [1, 2]
    assert "rank 2 is stopped (state T" in v.summary
    assert "rank 1 is in no collective" in v.summary and "Queue.get" in v.summary
    assert "rank 0 waits in all_reduce" in v.summary
    stopped = [g for g in report.groups if g.state == "stopped"]
    assert [g.ranks for g in stopped] == [[2]]
    assert any(s.skill_section == "skill/hangs.md#stopped-ranks" for s in v.next_steps)


def test_rank_that_left_its_loop_early_is_the_suspect() -> None:
    report = report_for("early_exit_loop")
    assert report.verdict.kind == "divergent_ranks"
    assert report.verdict.suspect_ranks == [0]
    site = by_rank(report)[0].call_site
    assert site is not None and site.function == "main" and site.file.endswith("hang_collectives.py")
    assert "Event.wait" in report.verdict.summary


def test_all_ranks_in_the_same_recv() -> None:
    report = report_for("same_recv")
    v = report.verdict
    assert v.kind == "all_in_same_collective"
    assert v.suspect_ranks == []
    # a recv is not a collective: with every rank receiving, nobody sends
    assert "all 2 ranks wait in recv" in v.summary and "so no rank sends" in v.summary
    assert "send/recv ordering deadlock" in v.summary
    assert v.next_steps[0].skill_section == "skill/hangs.md#point-to-point-deadlock"
    # without locals the peers are unknown: the next steps ask for them
    assert all(s.peer is None for s in report.stacks)
    assert {"collect_env", "dump_stacks", "analyze_flight_recorder"} <= {s.tool for s in v.next_steps}


def test_no_rank_in_a_collective() -> None:
    report = report_for("idle")
    assert report.verdict.kind == "no_collective"
    assert all(s.op is None for s in report.stacks)
    assert "Event.wait" in report.verdict.summary


def test_ddp_backward_with_python_frames_only_is_flagged_uncertain() -> None:
    report = report_for("ddp_skip_backward")
    ranks = by_rank(report)
    assert ranks[0].op == "autograd.backward"
    assert ranks[0].op_evidence and "--native" in ranks[0].op_evidence
    assert ranks[1].op == "barrier"
    assert report.verdict.kind == "mismatched_collectives"
    assert any("DDP" in e and "--native" in e for e in report.verdict.evidence)


def test_ddp_backward_read_from_native_reducer_frames() -> None:
    report = report_for("ddp_skip_backward_native")
    ranks = by_rank(report)
    assert ranks[0].op == "ddp.gradient_all_reduce"
    assert ranks[0].op_evidence and "c10d::Reducer" in ranks[0].op_evidence
    assert report.verdict.kind == "mismatched_collectives"


def test_ddp_backward_read_from_locals() -> None:
    report = report_for("ddp_skip_backward_locals")
    ranks = by_rank(report)
    assert ranks[0].op == "ddp.gradient_all_reduce"
    assert ranks[0].op_evidence and "DistributedDataParallel" in ranks[0].op_evidence


def test_spawn_ranks_read_their_index_from_wrap() -> None:
    job, stacks, _ = load("spawn_mismatch")
    assert job.launcher == "mp_spawn"
    indices = [_spawn_index(s.threads) for s in stacks]
    assert indices == [s.rank for s in stacks]
    assert sorted(i for i in indices if i is not None) == [0, 1]
    report = analyze(job, stacks, [])
    assert report.verdict.kind == "mismatched_collectives"
    assert {g.op for g in report.groups} == {"all_reduce", "barrier"}


def test_ranks_that_never_came_up_are_missing() -> None:
    report = report_for("env_partial_world")
    v = report.verdict
    assert report.job.launcher == "env"
    assert v.kind == "missing_ranks"
    assert v.suspect_ranks == [2]
    assert report.job.missing_ranks == [2]
    assert {s.op for s in report.stacks} == {"init_process_group"}
    assert "dump_stacks" in {s.tool for s in v.next_steps}


# -- merged hosts, exits, errors -----------------------------------------------------------------


def test_merged_hosts_give_the_same_verdict_and_unseen_ranks_are_missing() -> None:
    job, stacks, _ = load("mismatch_barrier")
    # host a has ranks 0,1; host b rank 2: merged by another layer into one job
    a = [s.model_copy(update={"host": "a"}) for s in stacks if s.rank in (0, 1)]
    b = [s.model_copy(update={"host": "b"}) for s in stacks if s.rank == 2]
    ranks = [r.model_copy(update={"host": "a" if r.rank in (0, 1) else "b"}) for r in job.ranks]
    merged = job.model_copy(update={"hosts": ["a", "b"], "ranks": ranks})
    report = analyze(merged, a + b, [])
    assert report.verdict.kind == "mismatched_collectives" and report.verdict.suspect_ranks == [2]
    # only host a answered: rank 2 is unseen, hence missing
    alone = job.model_copy(update={"ranks": [r for r in ranks if r.host == "a"]})
    report = analyze(alone, a, [])
    assert report.job.missing_ranks == [2]
    assert report.verdict.kind == "missing_ranks" and report.verdict.suspect_ranks == [2]


def test_zombie_rank_is_exited_and_missing() -> None:
    job, stacks, _ = load("same_recv")
    stacks[1] = stacks[1].model_copy(update={"threads": [], "state": "zombie"})
    report = analyze(job, stacks, [])
    assert report.job.exited_ranks == [1]
    assert report.verdict.kind == "missing_ranks"
    assert report.verdict.suspect_ranks == [1]
    assert "triage_logs" in {s.tool for s in report.verdict.next_steps}


def test_rank_that_exited_during_capture_does_not_hide_the_others() -> None:
    job, stacks, _ = load("mismatch_barrier")
    err = RankError(rank=1, pid=stacks[1].pid, kind="process_exited", message="gone", fix="f")
    stacks[1] = stacks[1].model_copy(update={"threads": [], "state": "dead", "error": err})
    report = analyze(job, stacks, [err])
    assert report.errors == [err]
    assert {s.rank: s.op for s in report.stacks if s.threads} == {0: "all_reduce", 2: "barrier"}
    assert 1 in report.job.exited_ranks


def test_rank_in_d_state_among_waiting_peers_is_the_suspect() -> None:
    job, stacks, _ = load("same_recv")
    # read with --nonblocking, its stack looks like the others', but it is stuck in the kernel
    stacks[1] = stacks[1].model_copy(update={"state": "disk_sleep"})
    report = analyze(job, stacks, [])
    assert report.verdict.kind == "divergent_ranks"
    assert report.verdict.suspect_ranks == [1]
    assert "uninterruptible sleep" in report.verdict.summary


def test_whole_job_stopped() -> None:
    job, stacks, _ = load("same_recv")
    stopped = [s.model_copy(update={"threads": [], "state": "stopped"}) for s in stacks]
    report = analyze(job, stopped, [])
    assert report.verdict.kind == "no_collective"
    assert report.verdict.suspect_ranks == [0, 1]
    assert "not running" in report.verdict.summary


def test_nothing_captured_is_inconclusive() -> None:
    job, stacks, _ = load("same_recv")
    errs = [RankError(rank=s.rank, pid=s.pid, kind="permission_denied", message="denied") for s in stacks]
    empty = [s.model_copy(update={"threads": [], "error": e}) for s, e in zip(stacks, errs, strict=True)]
    report = analyze(job, empty, errs)
    assert report.verdict.kind == "inconclusive"
    assert "permission_denied" in report.verdict.summary


# -- stacks shaped like real FSDP / DTensor / NCCL ones ------------------------------------------


def py(function: str, file: str, line: int) -> Frame:
    return Frame(function=function, file=file if file.startswith("/") else SP + file, line=line)


def native(function: str, lib: str = "libtorch_cuda.so") -> Frame:
    return Frame(function=function, file=SP + "torch/lib/" + lib, module=SP + "torch/lib/" + lib, native=True)


USER = "/home/me/train.py"


def test_fsdp2_unshard_all_gather() -> None:
    frames = [
        py("all_gather_into_tensor", "torch/distributed/distributed_c10d.py", 3850),
        py("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83),
        py("DefaultAllGather.__call__", "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 137),
        py("foreach_all_gather", "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 360),
        py("FSDPParamGroup.unshard", "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 390),
        py("FSDPState._pre_forward", "torch/distributed/fsdp/_fully_shard/_fsdp_state.py", 270),
        py("Module._call_impl", "torch/nn/modules/module.py", 1789),
        py("train_step", USER, 40),
        py("main", USER, 80),
    ]
    op, evidence = recognise_op(frames)
    assert op == "all_gather_into_tensor"
    assert evidence and "FSDP2 all_gather" in evidence and "FSDP2 unshard" in evidence
    assert find_call_site(frames) is not None and find_call_site(frames).function == "train_step"  # type: ignore[union-attr]


def test_fsdp2_reduce_scatter_in_backward_and_wait_for_unshard() -> None:
    frames = [
        py("reduce_scatter_tensor", "torch/distributed/distributed_c10d.py", 4700),
        py("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83),
        py("foreach_reduce", "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 600),
        py("FSDPParamGroup.post_backward", "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 620),
        py("_engine_run_backward", "torch/autograd/graph.py", 979),
        py("Tensor.backward", "torch/_tensor.py", 623),
        py("train_step", USER, 44),
    ]
    assert recognise_op(frames)[0] == "reduce_scatter_tensor"
    waiting = [
        native("cudaEventSynchronize", "libcudart.so.12"),
        py(
            "FSDPParamGroup.wait_for_unshard", "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 430
        ),
        py("FSDPState._pre_forward", "torch/distributed/fsdp/_fully_shard/_fsdp_state.py", 270),
        py("train_step", USER, 40),
    ]
    assert recognise_op(waiting)[0] == "fsdp2.unshard"


def test_fsdp1_flat_param_all_gather() -> None:
    frames = [
        py("all_gather_into_tensor", "torch/distributed/distributed_c10d.py", 3850),
        py("FlatParamHandle._all_gather_flat_param", "torch/distributed/fsdp/_flat_param.py", 1470),
        py("FlatParamHandle.unshard", "torch/distributed/fsdp/_flat_param.py", 1380),
        py("_unshard", "torch/distributed/fsdp/_runtime_utils.py", 300),
        py("_pre_forward_unshard", "torch/distributed/fsdp/_runtime_utils.py", 420),
        py("FullyShardedDataParallel.forward", "torch/distributed/fsdp/fully_sharded_data_parallel.py", 850),
        py("train_step", USER, 40),
    ]
    op, evidence = recognise_op(frames)
    assert op == "all_gather_into_tensor" and evidence and "FSDP" in evidence


def test_dtensor_redistribute_waits_in_wait_tensor() -> None:
    frames = [
        py("wait_tensor", "torch/distributed/_functional_collectives.py", 140),
        py("AsyncCollectiveTensor.wait", "torch/distributed/_functional_collectives.py", 1125),
        py("redistribute_local_tensor", "torch/distributed/tensor/_redistribute.py", 1600),
        py("Redistribute.forward", "torch/distributed/tensor/_redistribute.py", 1900),
        py("DTensor.redistribute", "torch/distributed/tensor/_api.py", 560),
        py("shard_batch", USER, 12),
    ]
    op, evidence = recognise_op(frames)
    assert op == "wait_tensor"
    assert evidence and "DTensor redistribute" in evidence


def test_nccl_work_wait_seen_only_in_native_frames() -> None:
    frames = [
        native("c10d::ProcessGroupNCCL::WorkNCCL::synchronize"),
        native("c10d::ProcessGroupNCCL::WorkNCCL::wait"),
        native("pybind11::cpp_function::dispatcher", "libtorch_python.so"),
        py("exchange", USER, 33),
    ]
    op, evidence = recognise_op(frames)
    assert op == "Work.wait" and evidence and "WorkNCCL" in evidence
    assert find_call_site(frames) is not None and find_call_site(frames).line == 33  # type: ignore[union-attr]


def test_object_collectives_are_named_by_the_api_called() -> None:
    frames = [
        py("all_gather", "torch/distributed/distributed_c10d.py", 4000),
        py("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83),
        py("all_gather_object", "torch/distributed/distributed_c10d.py", 3300),
        py("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83),
        py("gather_metrics", USER, 7),
        # an outer collective-looking frame beyond the user frame does not count
        py("barrier", "torch/distributed/distributed_c10d.py", 5356),
    ]
    assert recognise_op(frames)[0] == "all_gather_object"


def test_work_wait_read_from_the_source_line() -> None:
    frames = [py("exchange", USER, 33), py("main", USER, 50)]
    op, evidence = op_from_source(frames, "        req.wait()\n")
    assert op == "Work.wait" and evidence and "req.wait()" in evidence and "train.py:33" in evidence
    assert op_from_source(frames, "    time.sleep(5)\n") == (None, None)
    # a Python frame below the user line (threading.Event.wait) is not a C++ wait
    inner = [py("Event.wait", "/usr/lib/python3.11/threading.py", 629), *frames]
    assert op_from_source(inner, "        done.wait()\n") == (None, None)
    # the shell's reading is kept when the frames name nothing, and loses to the frames otherwise
    stack = RankStack(
        rank=0,
        pid=1,
        host="h",
        threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
        op=op,
        op_evidence=evidence,
    )
    job = Job(job_id="j", world_size=1, ranks=[RankProcess(rank=0, pid=1, host="h")])
    report = analyze(job, [stack], [])
    assert report.stacks[0].op == "Work.wait"
    assert report.verdict.kind == "all_in_same_collective"


def test_user_frames_exclude_torch_site_packages_and_stdlib() -> None:
    assert is_user_frame(py("main", USER, 1))
    assert not is_user_frame(py("all_reduce", "torch/distributed/distributed_c10d.py", 1))
    assert not is_user_frame(py("Queue.get", "/usr/lib/python3.11/queue.py", 171))
    assert not is_user_frame(py("<module>", "<string>", 1))
    assert not is_user_frame(native("c10d::Work::wait"))


def test_rank_ranges() -> None:
    assert rank_ranges([0, 1, 2, 4, 6, 7]) == "0-2,4,6-7"
    assert rank_ranges([]) == "none"


# -- many ranks, bounded answers, rendering ------------------------------------------------------


def synthetic(
    world: int, odd: set[int], case: str = "mismatch_barrier_native"
) -> tuple[Job, list[RankStack], int]:
    """``world`` ranks built from a real 2-rank native capture: rank 0's stack for most, rank 1's for ``odd``."""
    job, stacks, raw = load(case)
    raw_bytes = [len(json.dumps(r["pyspy"])) for r in raw["ranks"]]
    ranks = []
    out = []
    total = 0
    for r in range(world):
        src = 1 if r in odd else 0
        ranks.append(
            RankProcess(rank=r, local_rank=r % 8, pid=10_000 + r, host=f"node{r // 8}", state="sleeping")
        )
        out.append(stacks[src].model_copy(update={"rank": r, "pid": 10_000 + r, "host": f"node{r // 8}"}))
        total += raw_bytes[src]
    big = job.model_copy(
        update={"world_size": world, "ranks": ranks, "hosts": sorted({p.host for p in ranks})}
    )
    return big, out, total


def test_64_native_ranks_bounded_answer_is_small() -> None:
    job, stacks, raw_total = synthetic(64, {37})
    report = analyze(job, stacks, [])
    assert report.verdict.kind == "mismatched_collectives"
    assert report.verdict.suspect_ranks == [37]
    assert (
        "rank 37 waits in barrier" in report.verdict.summary and "ranks 0-36,38-63" in report.verdict.summary
    )
    bounded = bound_report(report)
    size = len(bounded.model_dump_json())
    assert size <= 16_000
    assert size * 10 <= raw_total, (size, raw_total)
    assert bounded.truncated and bounded.hint and "full_ranks" in bounded.hint
    assert [g.ranks for g in bounded.groups] == [[r for r in range(64) if r != 37], [37]]
    assert bounded.verdict == report.verdict
    # the suspect is named; its op and call site are its group's, said there once; nobody keeps
    # threads unless asked
    assert [(s.rank, s.op, bool(s.threads)) for s in bounded.stacks] == [(37, None, False)]
    assert (bounded.groups[1].op, bounded.groups[1].call_site) == ("barrier", report.stacks[37].call_site)
    # the frames where the groups differ are there
    odd = bounded.groups[1]
    assert any(f.function == "sync_metrics" for f in odd.frames)
    full = bound_report(report, full_ranks=[5])
    five = next(s for s in full.stacks if s.rank == 5)
    assert five.threads == stacks[5].threads


def test_unsymbolised_native_frames_do_not_split_stack_groups() -> None:
    job, stacks, _ = load("ddp_skip_backward_native")
    twin = stacks[0].model_copy(deep=True)
    twin.rank, twin.pid = 2, stacks[0].pid + 100
    addresses = 0
    for thread in twin.threads:
        for frame in thread.frames:
            if frame.native and frame.function.startswith("0x"):
                frame.function = hex(int(frame.function, 16) + 0x1000)  # another process, another address
                addresses += 1
    assert addresses
    job = job.model_copy(update={"world_size": 3})
    report = analyze(job, [*stacks, twin], [])
    assert report.stack_groups[0].ranks == [0, 2]


def test_1024_synthetic_ranks_are_grouped() -> None:
    job, stacks, _ = synthetic(1024, {3, 700})
    report = analyze(job, stacks, [])
    assert [len(g.ranks) for g in report.groups] == [1022, 2]
    assert report.verdict.suspect_ranks == [3, 700]


def test_human_view_collapses_identical_stacks_and_marks_the_odd_ones() -> None:
    report = report_for("mismatch_barrier")
    lines = list(render_stacks(report))
    text = "\n".join(lines)
    assert "== ranks 0-1 (2): all_reduce at" in text
    assert "== rank 2 (1): barrier at" in text and "<- suspect" in text
    assert any(line.startswith("   > sync_metrics") for line in lines)
    assert "outer frame(s) shared with ranks 0-1" in text
    verdict_at = next(i for i, line in enumerate(lines) if line.startswith("verdict: mismatched_collectives"))
    assert lines[verdict_at + 1].strip() == report.verdict.summary
    assert lines[-1].startswith("  3. ")


@pytest.mark.parametrize("case", sorted(p.stem for p in DATA.glob("*.json")))
def test_every_capture_renders_and_round_trips(case: str) -> None:
    report = report_for(case)
    assert StacksReport.model_validate_json(report.model_dump_json()) == report
    assert any(line.startswith("verdict: ") for line in render_stacks(report))


def test_bounded_answer_without_any_rank() -> None:
    report = analyze(Job(job_id="x"), [], [RankError(kind="unreachable", message="no route", host="n7")])
    bounded = bound_report(report)
    assert bounded.verdict.kind == "inconclusive" and bounded.truncated
    assert "host n7: capture failed: unreachable" in " ".join(bounded.verdict.evidence)


def test_ring_of_recvs_with_locals_is_named_a_deadlock() -> None:
    # four real gloo ranks, each in recv(src=rank+1): the peers come from the frames' locals
    report = report_for("ring_recv_locals")
    v = report.verdict
    assert v.kind == "all_in_same_collective" and v.suspect_ranks == []
    assert [(s.rank, s.op, s.peer) for s in report.stacks] == [(r, "recv", (r + 1) % 4) for r in range(4)]
    assert "ranks 0, 1, 2, 3 wait on each other in a cycle" in v.summary
    assert "every rank in it receives first, so none sends" in v.summary
    assert "rank 3 receives from rank 0, which receives from rank 1" in v.evidence
    # the peers are known, so no step asks for locals again
    assert not any("locals" in s.action for s in v.next_steps)
    assert "  send/recv: 0<-1, 1<-2, 2<-3, 3<-0" in list(render_stacks(report))
    assert v.next_steps[0].skill_section == "skill/hangs.md#point-to-point-deadlock"


def test_pipeline_stage_that_never_sent_is_the_suspect() -> None:
    # ranks 0 and 1 wait for the gradient of the next stage; rank 2 went to a barrier instead
    report = report_for("pipeline_locals")
    v = report.verdict
    assert v.kind == "mismatched_collectives" and v.suspect_ranks == [2]
    assert "rank 1 receives from rank 2, which waits in barrier at hang_collectives.py:" in " ".join(
        v.evidence
    )
    assert "cycle" not in v.summary


def test_p2p_peers_and_cycles_from_synthetic_stacks() -> None:
    job, stacks, _ = load("ring_recv_locals")
    # 0 and 1 form a matched pair (0 sends to 1, 1 receives from 0); 2 and 3 both receive from each other
    wanted = {0: ("send", "dst", 1), 1: ("recv", "src", 0), 2: ("recv", "src", 3), 3: ("recv", "src", 2)}
    edited = []
    for s in stacks:
        fn, name, peer = wanted[s.rank or 0]
        threads = []
        for t in s.threads:
            frames = []
            for f in t.frames:
                if f.function == "recv" and f.file.endswith("distributed_c10d.py"):
                    locals_ = [
                        LocalVar(name=name, repr=str(peer), arg=True),
                        LocalVar(name="group", repr="None"),
                    ]
                    f = f.model_copy(update={"function": fn, "locals": locals_})
                frames.append(f)
            threads.append(t.model_copy(update={"frames": frames}))
        edited.append(s.model_copy(update={"threads": threads}))
    report = analyze(job, edited, [])
    assert "rank 0 sends to rank 1, which receives from rank 0 (a matching pair)" in report.verdict.evidence
    # the matched pair is left out of the cycle
    assert (
        "ranks 2, 3 wait on each other in a cycle (2 receives from 3, 3 receives from 2)"
        in report.verdict.summary
    )


def test_p2p_peer_reads_global_then_default_group_rank() -> None:
    c10d = "/x/site-packages/torch/distributed/distributed_c10d.py"

    def frames(*locals_: tuple[str, str]) -> list[Frame]:
        return [
            Frame(function="recv", file=c10d, line=1, locals=[LocalVar(name=n, repr=v) for n, v in locals_]),
            Frame(function="main", file="/job/train.py", line=9),
        ]

    assert p2p_peer(frames(("src", "3"), ("group", "None"))) == 3
    assert p2p_peer(frames(("src", "None"), ("group", "None"), ("group_src", "2"))) == 2
    # a subgroup's group rank is not a global rank: left unknown
    assert p2p_peer(frames(("src", "None"), ("group", "<ProcessGroup at 0x7f>"), ("group_src", "2"))) is None
    assert p2p_peer(frames(("src", "None"), ("group", "None"))) is None  # recv from any source
    assert p2p_peer([Frame(function="recv", file=c10d, line=1)]) is None  # no locals captured


def test_pipeline_schedule_waiting_for_a_stage_that_skipped_its_step() -> None:
    # torch.distributed.pipelining: stages 1-2 wait in the schedule's _wait_batch_p2p (a C++ wait on
    # batch_isend_irecv work, no c10d frame) for stage 0, which skipped the step and went to a barrier
    report = report_for("pipeline_schedule_skip")
    ops = {s.rank: s.op for s in report.stacks}
    assert ops == {0: "barrier", 1: "pp.send_recv", 2: "pp.send_recv"}
    assert report.verdict.kind == "mismatched_collectives"
    assert report.verdict.suspect_ranks == [0]  # not the stages that wait for it


def test_fsdp2_ranks_waiting_in_unshard_for_a_rank_that_skipped_forward() -> None:
    # a real 3-rank fully_shard job on gloo: ranks 0 and 2 in forward, inside FSDP2's parameter
    # all-gather; rank 1 skipped the step and waits in a barrier
    report = report_for("fsdp2_skip_forward")
    assert report.verdict.kind == "mismatched_collectives" and report.verdict.suspect_ranks == [1]
    waiting = by_rank(report)[0]
    assert waiting.op_evidence and "inside FSDP2 all_gather, FSDP2 unshard" in waiting.op_evidence
    assert waiting.call_site and waiting.call_site.file.endswith("hang_fsdp2.py")


def test_compiled_graph_waiting_in_a_functional_collective() -> None:
    # a real torch.compile step on 3 gloo ranks: ranks 0 and 2 wait in the compiled graph's
    # torch.ops._c10d_functional.wait_tensor (C++, called from inductor's generated code), rank 1
    # skipped the step for a barrier. The generated file's line was recorded at capture time.
    job, stacks, raw = load("compiled_wait_tensor")
    sources: dict[str, str] = raw["sources"]

    def getline(file: str, line: int) -> str:
        return sources.get(f"{file}:{line}", "")

    plain = analyze(job, stacks, [])
    assert plain.verdict.suspect_ranks != [1]  # from frames alone, the waiting ranks look idle
    report = analyze(job, [_with_source_op(s, getline) for s in stacks], [])
    ops = {s.rank: s.op for s in report.stacks}
    assert ops == {0: "wait_tensor", 1: "barrier", 2: "wait_tensor"}
    assert report.verdict.kind == "mismatched_collectives" and report.verdict.suspect_ranks == [1]
    waiting = by_rank(report)[0]
    assert waiting.op_evidence and "generated by torch.compile" in waiting.op_evidence
    # the call site is the compiled function in the job's code, not inductor's generated file
    assert waiting.call_site and waiting.call_site.file.endswith("hang_compiled.py")
    assert waiting.call_site.function == "step"


def _rank_in_all_reduce(rank: int, torch_line: int, state: str = "sleeping") -> RankStack:
    frames = [
        py("all_reduce", "torch/distributed/distributed_c10d.py", torch_line),
        py("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83),
        py("train_step", USER, 40),
        py("main", USER, 80),
    ]
    thread = ThreadStack(thread_id=1, is_main=True, frames=frames)
    return RankStack(rank=rank, pid=100 + rank, host="h", state=state, threads=[thread])  # type: ignore[arg-type]


def test_one_collective_is_one_group_whatever_torch_line_each_rank_stopped_on() -> None:
    """Ranks stopped at distributed_c10d.py:3230 and :3252 inside all_reduce wait in one collective:
    groups key on the user's frames, not on torch-internal line numbers."""
    stacks = [_rank_in_all_reduce(r, 3230 if r < 2 else 3252) for r in range(4)]
    job = Job(job_id="j", world_size=4, backend="gloo")
    report = analyze(job, stacks, [])
    assert [g.ranks for g in report.groups] == [[0, 1, 2, 3]]
    assert [g.ranks for g in report.stack_groups] == [[0, 1, 2, 3]]
    # a different line in the user's own code is a different group
    moved = [*stacks[:3], _rank_in_all_reduce(3, 3230).model_copy(deep=True)]
    moved[3].threads[0].frames[2] = py("train_step", USER, 44)
    assert len(analyze(job, moved, []).stack_groups) == 2


def test_one_state_per_rank_in_one_answer() -> None:
    """Discovery read `running`; the dump read `sleeping`: the answer says `sleeping` in both places."""
    stacks = [_rank_in_all_reduce(r, 3230) for r in range(2)]
    procs = [RankProcess(rank=r, pid=100 + r, host="h", state="running") for r in range(2)]
    report = analyze(Job(job_id="j", world_size=2, backend="gloo", ranks=procs), stacks, [])
    assert {r.state for r in report.job.ranks} == {"sleeping"} == {s.state for s in report.stacks}


def _nccl_words(report: StacksReport) -> list[str]:
    v = report.verdict
    texts = [v.summary, *(s.action for s in v.next_steps)]
    return [t for t in texts if "NCCL" in t] + [
        s.tool or "" for s in v.next_steps if s.tool == "analyze_flight_recorder"
    ]


def test_a_gloo_job_is_not_told_about_nccl() -> None:
    """On gloo, the verdict and its next steps speak of gloo: no NCCL transport, no NCCL recorder dumps."""
    same = [_rank_in_all_reduce(r, 3230) for r in range(4)]
    report = analyze(Job(job_id="j", world_size=4, backend="gloo"), same, [])
    assert report.verdict.kind == "all_in_same_collective"
    assert _nccl_words(report) == [] and "Gloo transport" in report.verdict.summary
    odd = [*same[:3], _rank_in_all_reduce(3, 3230).model_copy(deep=True)]
    odd[3].threads[0].frames[0] = py("barrier", "torch/distributed/distributed_c10d.py", 4000)
    odd[3].threads[0].frames[2] = py("sync", USER, 12)
    mismatched = analyze(Job(job_id="j", world_size=4, backend="gloo"), odd, [])
    assert mismatched.verdict.kind == "mismatched_collectives" and _nccl_words(mismatched) == []
    # the same stacks on NCCL keep the NCCL steps
    nccl = analyze(Job(job_id="j", world_size=4, backend="nccl"), same, [])
    assert any(s.tool == "analyze_flight_recorder" for s in nccl.verdict.next_steps)
