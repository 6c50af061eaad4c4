"""The hang verdict on NCCL-shaped stacks (tests/data/stacks/nccl, built from real frame names
by its build.py): a rank that waits for the GPU is never blamed for where its CPU stopped."""

from __future__ import annotations

import pytest

from rankscope.analysis.hang.stacks import analyze
from rankscope.analysis.recorder.flight import analyze as analyze_flight
from rankscope.capabilities.recorder.flight import read_dumps
from rankscope.models.core import Backend, Job, RankStack, StacksReport
from tests.paths import DATA
from tests.unit.test_stacks_analysis import load as load_capture

NCCL = DATA / "stacks" / "nccl"


def load(
    case: str, backend: Backend | str | None = "as saved"
) -> tuple[Job, list[RankStack], dict[tuple[str, int], str]]:
    job, stacks, raw = load_capture(f"nccl/{case}")
    if backend != "as saved":
        job = job.model_copy(
            update={
                "backend": backend,
                "ranks": [r.model_copy(update={"backend": backend}) for r in job.ranks],
            }
        )
    source = {(k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1])): v for k, v in raw["source"].items()}
    return job, stacks, source


def report(case: str, backend: Backend | str | None = "as saved") -> StacksReport:
    job, stacks, source = load(case, backend)
    return analyze(job, stacks, [], source=source)


def waits(r: StacksReport) -> dict[int, str | None]:
    return {s.rank: s.wait for s in r.stacks if s.rank is not None}


# -- the shape: rank 2 took an extra barrier at step 3, the others ran on to step 10 ------


@pytest.mark.parametrize("case", ["extra_barrier", "extra_barrier_native"])
@pytest.mark.parametrize("backend", ["as saved", None])
def test_extra_barrier_names_the_rank_in_the_other_barrier_never_the_gpu_waiter(
    case: str, backend: str | None
) -> None:
    r = report(case, backend)
    v = r.verdict
    assert v.suspect_ranks == [2]
    assert 0 not in v.suspect_ranks
    assert waits(r)[0] == "gpu"
    assert "rank 0 waits for the GPU" in v.summary and "not where they are stuck" in v.summary
    assert v.confidence in ("high", "medium")


def test_gpu_wait_from_python_frames_is_inferred_and_says_native_confirms() -> None:
    r = report("extra_barrier")
    rank0 = next(s for s in r.stacks if s.rank == 0)
    assert rank0.wait_evidence is not None
    assert "inferred" in rank0.wait_evidence and "loss.item()" in rank0.wait_evidence
    assert "--native confirms" in rank0.wait_evidence


def test_gpu_wait_from_native_frames_names_the_cuda_call_under_the_spin() -> None:
    r = report("extra_barrier_native")
    by = {s.rank: s for s in r.stacks}
    assert by[0].wait == "gpu" and "cudaStreamSynchronize" in (by[0].wait_evidence or "")
    # NCCL's barrier syncs its stream inside ProcessGroupNCCL::barrier: the rank is in the barrier
    assert by[1].wait == "collective" and "ProcessGroupNCCL::barrier" in (by[1].wait_evidence or "")


@pytest.mark.parametrize("case", ["extra_barrier_locals", "extra_barrier_native_locals"])
def test_progress_counter_names_the_laggard_and_says_which_counter(case: str) -> None:
    v = report(case).verdict
    assert v.kind == "divergent_ranks" and v.suspect_ranks == [2] and v.confidence == "high"
    assert "rank 2: step=3 in main (train.py)" in v.summary
    assert "ranks 0-1,3: step=10" in v.summary
    assert any("progress counter step" in e for e in v.evidence)


def test_counters_keep_integers_only_and_skip_the_rank() -> None:
    r = report("extra_barrier_locals")
    for s in r.stacks:
        assert set(s.counters) == {"train.py:main:step"}


# -- every rank waits for the GPU but one ---------------------------------------------------------


@pytest.mark.parametrize("case", ["dataloader", "dataloader_native"])
def test_rank_in_dataloader_while_the_others_wait_for_the_gpu_is_the_suspect(case: str) -> None:
    r = report(case)
    v = r.verdict
    assert v.kind == "divergent_ranks" and v.suspect_ranks == [2]
    assert waits(r) == {0: "gpu", 1: "gpu", 2: "other", 3: "gpu"}
    assert "never issued" in v.summary
    # inferred from a source line: less sure than native frames
    assert v.confidence == ("high" if case.endswith("native") else "medium")
    assert v.next_steps[0].skill_section == "skill/hangs.md#nccl-hangs"


def test_dataloader_rank_is_found_without_the_backend_from_native_frames() -> None:
    v = report("dataloader_native", None).verdict
    assert v.suspect_ranks == [2] and v.confidence == "high"


# -- a majority in a CPU-blocking collective, one rank still evaluating ---------------------------


@pytest.mark.parametrize("case", ["barrier_eval", "barrier_eval_native"])
def test_rank_still_in_its_eval_loop_while_the_others_wait_in_barrier(case: str) -> None:
    r = report(case)
    v = r.verdict
    assert v.kind == "divergent_ranks" and v.suspect_ranks == [3]
    assert waits(r) == {0: "collective", 1: "collective", 2: "collective", 3: "other"}
    assert "rank 3 is in no collective, at train.py:60" in v.summary


# -- nothing on the CPU side decides ---------------------------------------------------------------


def test_every_rank_in_the_same_gpu_wait_cannot_tell_and_points_at_the_recorder() -> None:
    v = report("all_item_native_locals").verdict
    assert v.kind == "inconclusive" and v.suspect_ranks == [] and v.confidence == "low"
    assert "cannot tell" in v.summary
    assert "compute, data loading" not in v.summary
    first = v.next_steps[0]
    assert first.tool == "analyze_flight_recorder"
    assert "comm_lib_trace_rank_" in first.action and "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in first.action


def test_flight_recorder_beside_the_stacks_decides_on_nccl() -> None:
    dumps, errors = read_dumps([str(DATA / "flight" / "nccl_dtype")])
    flight = analyze_flight(dumps, errors)
    assert flight.verdict.suspect_ranks, "the recorder data must name a rank for this test to mean anything"
    job, stacks, source = load("all_item_native_locals")
    v = analyze(job, stacks, [], flight, source=source).verdict
    assert v.suspect_ranks == flight.verdict.suspect_ranks
    assert v.confidence == "high"
    assert v.summary.startswith("flight recorder:")
    assert any(e.startswith("flight recorder:") for e in v.evidence)


def test_recorder_does_not_override_gloo_stacks() -> None:
    dumps, errors = read_dumps([str(DATA / "flight" / "nccl_dtype")])
    flight = analyze_flight(dumps, errors)
    job, stacks, source = load("barrier_eval", "gloo")
    v = analyze(job, stacks, [], flight, source=source).verdict
    assert v.suspect_ranks == [3]


def test_every_verdict_has_a_confidence() -> None:
    for path in sorted(NCCL.glob("*.json")):
        for backend in ("as saved", None, "gloo"):
            v = report(path.stem, backend).verdict
            assert v.confidence in ("high", "medium", "low"), path.stem


def test_job_backend_is_inferred_from_native_frames_when_not_read() -> None:
    r = report("dataloader_native", None)
    assert r.job.backend == "nccl"


def test_answer_is_no_larger_than_the_stacks_it_summarises() -> None:
    raw = (NCCL / "dataloader_native.json").read_text()
    r = report("dataloader_native")
    assert len(r.verdict.model_dump_json()) < len(raw) / 4


def test_cannot_tell_leads_with_this_jobs_recorder_and_offers_ras() -> None:
    from rankscope.analysis.hang.stacks import analyze as analyze_stacks
    from rankscope.analysis.sizing.bound import bound_report
    from rankscope.models.core import Job
    from tests.unit.test_waits_counters_backend import gpu_waiting_ranks

    stacks = gpu_waiting_ranks(4, lambda r: {})
    plan = "Each rank writes its recorder when its watchdog times out (...) to /d/fr_<rank>; analyze those files."
    report = analyze_stacks(Job(job_id="j", world_size=4, backend="nccl", recorder=plan), stacks, [])
    steps = report.verdict.next_steps
    assert report.verdict.kind == "inconclusive" and steps[0].action == plan
    assert steps[1].tool == "dump_stacks" and steps[1].args == {"locals": True}
    assert steps[-1].tool == "dump_stacks" and steps[-1].args == {"ras": True}
    assert bound_report(report).job.recorder is None  # said once, in the first step
