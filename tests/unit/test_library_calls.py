"""A lone rank inside a library call that is itself a collective: named with the call, its line,
the guard above it and the fix.

Gloo captures are real (tests/programs/hang_libcall.py, 4 ranks, rank 0 calls alone); the NCCL
shapes are built from torch 2.13's source: on NCCL the call's collective is enqueued and the
CPU stops at the next GPU wait inside the call (``.item()`` in ZeRO's ``_broadcast_object``), or in
the enqueue of a collective the call makes, while the others went on and wait for the GPU.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from rankscope.analysis.hang.counters import on_subgroup
from rankscope.analysis.hang.library_calls import _CLASS_ONLY, KNOWN_CALLS, known_name, library_call
from rankscope.analysis.hang.stacks import analyze, annotate
from rankscope.analysis.hang.verdict_mismatch import library_fix
from rankscope.models.core import CallSite, Frame, Job, LocalVar, RankStack, ThreadStack
from tests.unit.test_verdict_golden import _load
from tests.verdict_builders import facts_of

SITE = "/venv/lib/python3.11/site-packages/"
TORCH = f"{SITE}torch/"
JOB = "/job/train.py"
PG = "<torch._C._distributed_c10d.ProcessGroup at 0x7f0>"


def f(function: str, file: str, line: int, **locals_: str) -> Frame:
    """A Python frame; ``locals_`` become its locals (name -> repr)."""
    held = [LocalVar(name=k, repr=v) for k, v in locals_.items()] or None
    return Frame(function=function, file=file, line=line, locals=held)


def torch_(function: str, path: str, line: int) -> Frame:
    return f(function, f"{TORCH}{path}", line)


def main(line: int) -> Frame:
    return f("main", JOB, line)


# -- the real gloo captures ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "call", "inside"),
    [
        ("libcall_zero", "ZeroRedundancyOptimizer.consolidate_state_dict", "broadcast"),
        ("libcall_fsdp2", "get_model_state_dict", "wait_tensor"),
        ("libcall_dcp", "torch.distributed.checkpoint.save", "gather_object"),
        ("libcall_zero_backward", "ZeroRedundancyOptimizer.consolidate_state_dict", "broadcast"),
    ],
)
def test_a_library_call_made_on_rank_0_alone_is_named_with_its_guard_and_fix(
    case: str, call: str, inside: str
) -> None:
    """Rank 0 checkpoints alone under `if rank == 0 and step == 2:`; ranks 1-3 went on to the next
    step's all_reduce. The call is named, with the job's line and the guard, never a subgroup."""
    job, stacks, source = _load(case, "as saved")
    v = analyze(job, stacks, [], source=source).verdict
    assert v.kind == "mismatched_collectives" and v.suspect_ranks == [0] and v.confidence == "high", v
    assert v.summary.startswith(f"rank 0 alone called {call} (hang_libcall.py:"), v.summary
    assert f"it waits in {inside} inside it, while ranks 1-3 went on to " in v.summary
    assert "`if rank == 0 and step == 2:` guards the call" in v.summary and "subgroup" not in v.summary
    assert v.next_steps[0].action.startswith(f"Fix: call {call} (hang_libcall.py:")
    assert "keep only the rank's own work (the file write) on rank 0" in v.next_steps[0].action


def test_a_process_group_a_library_passes_is_not_a_subgroup() -> None:
    """ZeRO passes its process_group (dist.group.WORLD unless told otherwise): that says nothing; a
    ProcessGroup the job's own line passes is a subgroup; group=None is the default group."""
    wrapper = f(
        "_exception_logger.<locals>.wrapper",
        f"{TORCH}distributed/c10d_logger.py",
        83,
        args="(<Tensor at 0x1>)",
        kwargs=f'{{"src": 1, "group": {PG}, "async_op": False}}',
    )
    c10d = torch_("broadcast", "distributed/distributed_c10d.py", 3151)
    zero = torch_("_broadcast_object", "distributed/optim/zero_redundancy_optimizer.py", 111)
    assert on_subgroup([c10d, wrapper, zero, main(40)]) is None
    assert on_subgroup([c10d, wrapper, main(40)]) is True
    none = wrapper.model_copy(update={"locals": [LocalVar(name="kwargs", repr='{"group": None}')]})
    assert on_subgroup([c10d, none, zero, main(40)]) is False


# -- the call, read from the stack -----------------------------------------------------------------


C10D = "distributed/distributed_c10d.py"
CASES: dict[str, tuple[list[Frame], str]] = {
    # clip_grad_norm_ over DTensor parameters: the norm's all_reduce under _no_grad's wrapper
    "clip_grad_norm_": (
        [
            torch_("wait_tensor", "distributed/_functional_collectives.py", 150),
            torch_("redistribute_local_tensor", "distributed/tensor/_redistribute.py", 900),
            torch_("_get_total_norm", "nn/utils/clip_grad.py", 90),
            torch_("_no_grad.<locals>._no_grad_wrapper", "nn/utils/clip_grad.py", 41),
            torch_("clip_grad_norm_", "nn/utils/clip_grad.py", 230),
            torch_("_no_grad.<locals>._no_grad_wrapper", "nn/utils/clip_grad.py", 41),
        ],
        "clip_grad_norm_",
    ),
    # SyncBatchNorm's forward gathers the statistics; model(x) runs nn.Module's dispatch first
    "sync_batch_norm": (
        [
            torch_("all_gather_into_tensor", C10D, 4000),
            torch_("SyncBatchNorm.forward", "nn/modules/_functions.py", 60),
            torch_("Function.apply", "autograd/function.py", 581),
            torch_("SyncBatchNorm.forward", "nn/modules/batchnorm.py", 858),
            torch_("Module._call_impl", "nn/modules/module.py", 1784),
            torch_("Module._wrapped_call_impl", "nn/modules/module.py", 1773),
        ],
        "SyncBatchNorm.forward",
    ),
    # DDP's construction verifies the parameters' shapes across ranks, in C++ below Python
    "ddp_init": (
        [
            torch_("_verify_param_shape_across_processes", "distributed/utils.py", 300),
            torch_("DistributedDataParallel.__init__", "nn/parallel/distributed.py", 1064),
        ],
        "DistributedDataParallel(...)",
    ),
    # FSDP1's summon_full_params: contextlib's __enter__ on both sides of it
    "summon_full_params": (
        [
            torch_("all_gather_into_tensor", C10D, 4000),
            torch_("_unshard", "distributed/fsdp/_runtime_utils.py", 300),
            torch_("_unshard_params", "distributed/fsdp/_unshard_param_utils.py", 200),
            f("_GeneratorContextManager.__enter__", "/usr/lib/python3.11/contextlib.py", 137),
            torch_(
                "FullyShardedDataParallel.summon_full_params",
                "distributed/fsdp/fully_sharded_data_parallel.py",
                930,
            ),
            f("_GeneratorContextManager.__enter__", "/usr/lib/python3.11/contextlib.py", 137),
        ],
        "FullyShardedDataParallel.summon_full_params",
    ),
    # DDP's join: the context's exit all-reduces until every rank joined
    "join": (
        [
            torch_("all_reduce", C10D, 3252),
            torch_("_exception_logger.<locals>.wrapper", "distributed/c10d_logger.py", 83),
            torch_("Join._get_num_nonjoined_procs", "distributed/algorithms/join.py", 286),
            torch_("Join.__exit__", "distributed/algorithms/join.py", 270),
        ],
        "Join (DDP's join)",
    ),
    # FSDP1's state_dict(): nn.Module's state_dict runs FSDP's hooks, which unshard (all-gather);
    # on NCCL the CPU stops at a GPU wait below them: the FSDP frame says it is a collective
    "fsdp_state_dict": (
        [
            torch_("FlatParamHandle.unshard", "distributed/fsdp/_flat_param.py", 1400),
            torch_("_unshard", "distributed/fsdp/_runtime_utils.py", 300),
            torch_("_full_pre_state_dict_hook", "distributed/fsdp/_state_dict_utils.py", 290),
            torch_("_pre_state_dict_hook", "distributed/fsdp/_state_dict_utils.py", 780),
            torch_("Module.state_dict", "nn/modules/module.py", 2200),
        ],
        "Module.state_dict",
    ),
    # a metrics package whose compute() is wrapped (torchmetrics' Metric._wrap_compute): the
    # wrapper is not the call's name, the function it runs is
    "wrapped_metric": (
        [
            torch_("all_gather", C10D, 2900),
            f("gather_all_tensors", f"{SITE}metricslib/utilities/distributed.py", 120),
            f("Metric._sync_dist", f"{SITE}metricslib/metric.py", 500),
            f("Metric.sync", f"{SITE}metricslib/metric.py", 560),
            f("Metric._wrap_compute.<locals>.wrapped_func", f"{SITE}metricslib/metric.py", 640),
        ],
        "Metric.sync",
    ),
    # DTensor.full_tensor: redistribute to Replicate, a functional all_gather
    "full_tensor": (
        [
            torch_("AsyncCollectiveTensor.wait", "distributed/_functional_collectives.py", 1122),
            torch_("DTensor.full_tensor", "distributed/tensor/_api.py", 770),
        ],
        "DTensor.full_tensor",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_outermost_library_function_names_the_call(case: str) -> None:
    frames, name = CASES[case]
    call = library_call([*frames, main(30)])
    assert call is not None and call.name == name, call
    assert call.site.line == 30


def test_a_collective_the_job_calls_itself_is_no_library_call() -> None:
    frames = [
        torch_("all_gather_object", C10D, 3100),
        torch_("_exception_logger.<locals>.wrapper", "distributed/c10d_logger.py", 83),
        main(12),
    ]
    assert library_call(frames) is None
    assert library_call([torch_("Tensor.item", "_tensor.py", 1), main(12)]) is None  # no collective in sight


def test_an_unlisted_library_is_decided_from_its_source() -> None:
    """An installed package nobody listed, its CPU at a GPU wait (NCCL): the collective called on the
    lines read above its frame decides; without that source, nothing says it is one."""
    metrics = f"{SITE}evalkit/metrics.py"
    frames = [f("Accuracy._sync", metrics, 22), f("Accuracy.compute", metrics, 26), main(50)]
    source = {(metrics, 21): "        dist.all_gather_object(states, (self.correct, self.total))"}
    call = library_call(frames, source)
    assert call is not None and call.name == "Accuracy.compute" and "all_gather_object" in call.how
    assert library_call(frames, {}) is None


# -- NCCL shapes ----------------------------------------------------------------------------------


def _nccl(
    rank0: list[Frame], lines: dict[int, str]
) -> tuple[Job, list[RankStack], dict[tuple[str, int], str]]:
    """Rank 0 in ``rank0`` (under save_checkpoint at train.py:41, called from train.py:73 under
    `if rank == 0 and step == 2:`); ranks 1-3 went on and wait for the GPU at `loss.item()`."""
    stacks = [
        RankStack(
            rank=0,
            pid=100,
            host="h",
            state="sleeping",
            threads=[
                ThreadStack(
                    thread_id=1,
                    is_main=True,
                    frames=[*rank0, f("save_checkpoint", JOB, 41), main(73)],
                )
            ],
        )
    ] + [
        RankStack(
            rank=r,
            pid=100 + r,
            host="h",
            state="sleeping",
            threads=[ThreadStack(thread_id=1, is_main=True, frames=[main(70)])],
        )
        for r in (1, 2, 3)
    ]
    job = Job(job_id="j", world_size=4, backend="nccl")
    source = {(JOB, n): text for n, text in lines.items()}
    return job, stacks, source


LINES = {
    40: "def save_checkpoint(model, optim):",
    41: "    optim.consolidate_state_dict(to=0)",
    66: "    for step in range(steps):",
    70: "        total += loss.item()",
    72: "        if rank == 0 and step == 2:",
    73: "            save_checkpoint(model, optim)",
}


def test_nccl_zero_consolidate_waits_for_the_gpu_inside_the_call() -> None:
    """ZeRO's _broadcast_object reads the length it received (`int(length_tensor.item())`): on
    NCCL rank 0's CPU stops there, in no c10d frame; the table says the call is a collective."""
    rank0 = [
        torch_("_broadcast_object", "distributed/optim/zero_redundancy_optimizer.py", 112),
        torch_(
            "ZeroRedundancyOptimizer.consolidate_state_dict",
            "distributed/optim/zero_redundancy_optimizer.py",
            564,
        ),
    ]
    job, stacks, source = _nccl(rank0, LINES)
    v = analyze(job, stacks, [], source=source).verdict
    assert v.kind == "mismatched_collectives" and v.suspect_ranks == [0] and v.confidence == "high", v
    assert v.summary.startswith(
        "rank 0 alone called ZeroRedundancyOptimizer.consolidate_state_dict (train.py:41: "
        "`optim.consolidate_state_dict(to=0)`), a collective every rank of its group must call: its CPU waits "
        "inside it, at torch/distributed/optim/zero_redundancy_optimizer.py:112"
    ), v.summary
    assert "`if rank == 0 and step == 2:` guards the call at train.py:73" in v.summary
    assert v.next_steps[0].action.startswith("Fix: call ZeroRedundancyOptimizer.consolidate_state_dict")


def test_nccl_metrics_compute_sits_in_the_collectives_enqueue() -> None:
    """An installed metrics package's compute() in all_gather_object: the CPU is in the enqueue."""
    metrics = f"{SITE}evalkit/metrics.py"
    rank0 = [
        torch_("all_gather_object", C10D, 3100),
        torch_("_exception_logger.<locals>.wrapper", "distributed/c10d_logger.py", 83),
        f("Accuracy._sync", metrics, 21),
        f("Accuracy.compute", metrics, 26),
    ]
    lines = {**LINES, 41: "    metric.compute()"}
    job, stacks, source = _nccl(rank0, lines)
    v = analyze(job, stacks, [], source=source).verdict
    assert v.suspect_ranks == [0] and v.confidence == "high", v
    assert v.summary.startswith("rank 0 alone called Accuracy.compute (train.py:41: `metric.compute()`)"), v
    assert "it waits in all_gather_object inside it" in v.summary


def test_nccl_without_a_guard_is_medium() -> None:
    rank0 = [torch_("DTensor.full_tensor", "distributed/tensor/_api.py", 770)]
    lines = {k: v for k, v in LINES.items() if k != 72}
    job, stacks, source = _nccl(rank0, lines)
    v = analyze(job, stacks, [], source=source).verdict
    assert v.suspect_ranks == [0] and v.confidence == "medium" and "DTensor.full_tensor" in v.summary, v


def test_call_site_is_the_jobs_frame() -> None:
    call = library_call([torch_("DTensor.full_tensor", "distributed/tensor/_api.py", 770), main(9)])
    assert call is not None and call.site == CallSite(file=JOB, line=9, function="main")


def test_two_ranks_split_evenly_by_a_library_call_under_a_rank_condition() -> None:
    """Two ranks: rank 0 in ZeRO's consolidate_state_dict under `if rank == 0:`, rank 1 in the next
    all_reduce. An even split, decided by the condition above the call, with the call named."""
    job, stacks, source = _load("libcall_zero", "as saved")
    two = [s.model_copy(update={"rank": s.rank}) for s in stacks if s.rank in (0, 1)]
    v = analyze(
        job.model_copy(update={"world_size": 2, "ranks": job.ranks[:2]}), two, [], source=source
    ).verdict
    assert v.suspect_ranks == [0] and v.confidence == "high", v
    assert v.summary.startswith("rank 0 alone called ZeroRedundancyOptimizer.consolidate_state_dict"), (
        v.summary
    )
    assert v.next_steps[0].action.startswith("Fix: call ZeroRedundancyOptimizer.consolidate_state_dict")


def test_nccl_full_state_dict_waits_for_the_gpu_inside_the_gather() -> None:
    """FSDP2's get_model_state_dict(full_state_dict=True) on NCCL: each DTensor's full_tensor() is
    enqueued and the CPU stops where the gathered tensor is used (``_iterate_state_dict`` in
    torch/distributed/_state_dict_utils.py), under _gather_state_dict; no c10d frame is in sight."""
    rank0 = [
        torch_("_iterate_state_dict", "distributed/_state_dict_utils.py", 131),
        torch_("_gather_state_dict", "distributed/_state_dict_utils.py", 288),
        torch_("_maybe_full_or_cpu_state_dict", "distributed/checkpoint/state_dict.py", 484),
        torch_("_get_model_state_dict", "distributed/checkpoint/state_dict.py", 560),
        torch_("get_model_state_dict", "distributed/checkpoint/state_dict.py", 1221),
    ]
    lines = {
        **LINES,
        41: "    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))",
    }
    job, stacks, source = _nccl(rank0, lines)
    v = analyze(job, stacks, [], source=source).verdict
    assert v.suspect_ranks == [0] and v.confidence == "high", v
    assert v.summary.startswith(
        "rank 0 alone called get_model_state_dict (train.py:41: `sd = get_model_state_dict("
    ), v
    assert "its CPU waits inside it, at torch/distributed/_state_dict_utils.py:131" in v.summary


def test_a_table_entry_of_one_class_does_not_name_another_class_of_its_file() -> None:
    """batchnorm.py's BatchNorm2d.forward is no collective; SyncBatchNorm.forward is (py-spy's
    qualified names); an unqualified name (Python before 3.11) could be any class's: not taken."""
    assert known_name(torch_("BatchNorm2d.forward", "nn/modules/batchnorm.py", 170)) is None
    assert (
        known_name(torch_("SyncBatchNorm.forward", "nn/modules/batchnorm.py", 858)) == "SyncBatchNorm.forward"
    )
    assert known_name(torch_("forward", "nn/modules/batchnorm.py", 858)) is None
    assert known_name(torch_("_DDPSink.__init__", "nn/parallel/distributed.py", 300)) is None


def test_the_default_group_passed_by_name_on_the_jobs_line_is_no_subgroup() -> None:
    """`dist.all_reduce(t, group=dist.group.WORLD)` passes a ProcessGroup, but the line names the world."""
    wrapper = f(
        "_exception_logger.<locals>.wrapper",
        f"{TORCH}distributed/c10d_logger.py",
        83,
        args="(<Tensor at 0x1>)",
        kwargs=f'{{"group": {PG}}}',
    )
    frames = [torch_("all_reduce", C10D, 3252), wrapper, main(12)]
    stack = RankStack(
        rank=0, pid=1, host="h", threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)]
    )
    world = {(JOB, 12): "    dist.all_reduce(t, group=dist.group.WORLD)"}
    assert annotate(stack, source=world).subgroup is False
    assert annotate(stack, source={(JOB, 12): "    dist.all_reduce(t, group=pairs[1])"}).subgroup is True


def test_a_library_loop_every_rank_runs_is_no_call_made_alone() -> None:
    """A Trainer.fit every rank is in (hang_library.py's shape): the rank that skipped a batch inside
    it is not said to have called Trainer.fit alone, and the fix is the loop's, not the call's."""
    trainer = f"{SITE}trainlib/trainer.py"
    ranks = []
    for r in range(3):
        odd = r == 1
        frames = [
            torch_("barrier" if odd else "all_reduce", C10D, 3000),
            f("Checkpoint.on_step_end" if odd else "Trainer._step", trainer, 40 if odd else 30),
            f("Trainer.fit", trainer, 27 if odd else 26),
            main(12),
        ]
        ranks.append(
            RankStack(
                rank=r,
                pid=r + 1,
                host="h",
                threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
                op="barrier" if odd else "all_reduce",
                wait="collective",
                call_site=CallSite(file=JOB, line=12, function="main"),
            )
        )

    facts = facts_of(ranks)
    assert library_fix(facts, [1]) is None
    assert all(
        "alone called" not in s for s in [analyze(Job(job_id="j", world_size=3), ranks, []).verdict.summary]
    )


def test_a_rank_in_no_collective_frame_but_inside_a_collective_library_call() -> None:
    """Gloo: rank 0 builds DDP alone (`if rank == 0:`); DDP's construction verifies the parameters
    across ranks in C++ (_verify_param_shape_across_processes), under no c10d frame, so rank 0 reads
    as in no collective. The divergent verdict still says the call is a collective, and the fix."""
    rank0 = [
        torch_("_verify_param_shape_across_processes", "distributed/utils.py", 300),
        torch_("DistributedDataParallel.__init__", "nn/parallel/distributed.py", 1064),
        main(30),
    ]
    stacks = [
        RankStack(rank=0, pid=1, host="h", threads=[ThreadStack(thread_id=1, is_main=True, frames=rank0)])
    ] + [
        RankStack(
            rank=r,
            pid=1 + r,
            host="h",
            threads=[
                ThreadStack(thread_id=1, is_main=True, frames=[torch_("all_reduce", C10D, 3252), main(34)])
            ],
        )
        for r in (1, 2, 3)
    ]
    source = {(JOB, 29): "    if rank == 0:", (JOB, 30): "        model = DDP(model)"}
    v = analyze(Job(job_id="j", world_size=4, backend="gloo"), stacks, [], source=source).verdict
    assert v.kind == "divergent_ranks" and v.suspect_ranks == [0], v
    assert "rank 0 is inside DistributedDataParallel(...) (train.py:30: `model = DDP(model)`)" in (
        v.summary
    ), v.summary
    assert v.next_steps[0].action.startswith("Fix: call DistributedDataParallel(...) (train.py:30)")


def test_every_table_entry_is_a_function_of_the_installed_torch() -> None:
    """The table's words were read in torch's source: each (file, function) is defined there, in its
    class where the entry counts in one class only, so a torch that moves one fails here first."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    for frag, fn in KNOWN_CALLS:
        text = (root / frag).read_text(encoding="utf-8")
        assert re.search(rf"^\s*def {re.escape(fn)}\(", text, re.M), (frag, fn)
        owner = _CLASS_ONLY.get((frag, fn))
        assert owner is None or re.search(rf"^class {owner}\b", text, re.M), (frag, owner)
