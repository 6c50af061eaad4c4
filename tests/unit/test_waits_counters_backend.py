"""What a rank waits for, its progress counters and its backend: the facts the NCCL verdict reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rankscope.analysis.hang.backend import ProcessSigns, job_backend_of, rank_backend
from rankscope.analysis.hang.counters import counter_split, int_locals
from rankscope.analysis.hang.stacks import analyze, annotate
from rankscope.analysis.hang.waits import classify_wait
from rankscope.models.core import Frame, Job, LocalVar, RankStack, ThreadStack

SP = "/usr/lib/python3.11/site-packages/"
TRAIN = "/job/train.py"


def nat(name: str, lib: str = "/usr/lib/libtorch_cuda.so") -> Frame:
    return Frame(function=name, file=lib, native=True)


def pyf(name: str, file: str = TRAIN, line: int = 10, **ints: int | str) -> Frame:
    locs = [LocalVar(name=k, repr=str(v)) for k, v in ints.items()] or None
    return Frame(function=name, file=file, line=line, locals=locs)


# -- classify_wait ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("native", "kind"),
    [
        (
            ["c10d::TCPStore::get(std::string const&)", "c10d::ProcessGroupNCCL::broadcastUniqueNCCLID"],
            "collective",
        ),
        (["pncclCommInitRankConfig", "c10d::NCCLComm::create"], "collective"),
        (
            [
                "nanosleep",
                "c10d::ProcessGroupNCCL::WorkNCCL::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >)",
            ],
            "collective",
        ),
        (["cudaLaunchKernel", "ncclLaunchKernel", "ncclGroupEnd"], "launch_queue"),
        (
            [
                "cudaEventSynchronize",
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::synchronize_and_free_events",
            ],
            "allocator",
        ),
        (["cudaDeviceSynchronize", "c10::cuda::device_synchronize()"], "gpu"),
        (
            [
                "cuMemcpyDtoHAsync_v2",
                "cudaMemcpyAsync",
                "at::native::_local_scalar_dense_cuda(at::Tensor const&)",
            ],
            "gpu",
        ),
        (
            ["cudaStreamSynchronize", "c10d::ProcessGroupNCCL::barrier(c10d::BarrierOptions const&)"],
            "collective",
        ),
        (["poll"], "other"),
    ],
)
def test_native_frames_decide_the_wait(native: list[str], kind: str) -> None:
    frames = [nat("0x7f00deadbeef", "/usr/lib/libcuda.so.1"), *(nat(n) for n in native), pyf("main")]
    got, evidence = classify_wait(frames, None, backend="nccl", has_native=True)
    assert got == kind
    if kind != "other":
        assert evidence.startswith("native frame ")


def test_torch_cuda_synchronize_frame_is_a_gpu_wait_on_any_backend() -> None:
    frames = [pyf("synchronize", SP + "torch/cuda/__init__.py", 1219), pyf("main")]
    kind, evidence = classify_wait(frames, None, backend="gloo", has_native=False)
    assert kind == "gpu" and "--native confirms" in evidence


def test_object_collective_conversion_is_a_gpu_wait_only_off_gloo() -> None:
    frames = [
        pyf("_object_to_tensor", SP + "torch/distributed/distributed_c10d.py", 3410),
        pyf("all_gather_object", SP + "torch/distributed/distributed_c10d.py", 3514),
        pyf("main"),
    ]
    assert classify_wait(frames, "all_gather_object", backend="nccl", has_native=False)[0] == "gpu"
    assert classify_wait(frames, "all_gather_object", backend="gloo", has_native=False)[0] == "collective"


@pytest.mark.parametrize(
    "line", ["loss.item()", "x = t.cpu()", "v = float(loss)", "torch.cuda.synchronize()", "a = t.tolist()"]
)
def test_user_line_that_syncs_is_an_inferred_gpu_wait(line: str) -> None:
    kind, evidence = classify_wait(
        [pyf("main")], None, backend="nccl", has_native=False, user_line=line, user_site="train.py:10"
    )
    assert kind == "gpu" and evidence.startswith("inferred") and "train.py:10" in evidence


def test_user_line_is_not_a_gpu_wait_on_gloo_or_when_it_does_not_sync() -> None:
    assert (
        classify_wait([pyf("main")], None, backend="gloo", has_native=False, user_line="loss.item()")[0]
        == "other"
    )
    assert (
        classify_wait([pyf("main")], None, backend="nccl", has_native=False, user_line="time.sleep(5)")[0]
        == "other"
    )
    kind, evidence = classify_wait(
        [pyf("main")], None, backend=None, has_native=False, user_line="loss.item()"
    )
    assert kind == "gpu" and "backend not read" in evidence


def test_user_line_with_python_frames_below_it_is_not_where_the_cpu_waits() -> None:
    frames = [pyf("Linear.forward", SP + "torch/nn/modules/linear.py", 134), pyf("main", line=10)]
    stack = RankStack(
        rank=0, pid=1, host="h", threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)]
    )
    out = annotate(stack, backend="nccl", source={(TRAIN, 10): "loss = model(x).item()"})
    assert out.wait == "other"


def gpu_waiting_ranks(n: int, extra: Callable[[int], dict[str, object]]) -> list[RankStack]:
    """``n`` ranks all waiting for the GPU at the same line, each with its own ``extra`` fields."""
    frames = [nat("cudaStreamSynchronize"), pyf("main", line=47)]
    base = RankStack(
        rank=0,
        pid=100,
        host="h",
        state="running",
        threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
    )
    return [base.model_copy(update={"rank": r, "pid": 100 + r, **extra(r)}) for r in range(n)]


# -- counters -----------------------------------------------------------------------------------


def ranks_with(values: dict[int, dict[str, int]]) -> list[RankStack]:
    return [
        RankStack(rank=r, pid=100 + r, host="h", counters={f"train.py:main:{k}": v for k, v in c.items()})
        for r, c in values.items()
    ]


def test_int_locals_keep_integers_of_the_jobs_frames_only() -> None:
    frames = [
        pyf("all_reduce", SP + "torch/distributed/distributed_c10d.py", 3000, async_op=0),
        pyf("train_step", step=4, loss="tensor(0.3)", rank=2, token="'s3cr3t'"),
        pyf("main", epoch=1, local_rank=2),
    ]
    assert int_locals(frames) == {"train.py:train_step:step": 4, "train.py:main:epoch": 1}


def test_counter_split_majority_and_minority() -> None:
    split = counter_split(ranks_with({0: {"step": 10}, 1: {"step": 10}, 2: {"step": 3}, 3: {"step": 10}}))
    assert split is not None and split.suspects == [2] and split.confidence == "high"
    assert "rank 2: step=3 in main (train.py)" in split.summary


@pytest.mark.parametrize(
    "values",
    [
        {0: {"step": 1}, 1: {"step": 2}},  # two ranks: no majority
        {0: {"step": 1}, 1: {"step": 1}, 2: {"step": 2}, 3: {"step": 2}},  # even split
        {0: {"step": 0}, 1: {"step": 1}, 2: {"step": 2}},  # the rank itself
        {0: {"step": 5}, 1: {"step": 5}, 2: {"step": 5}},  # agree
    ],
)
def test_counter_split_says_nothing_when_no_majority_decides(values: dict[int, dict[str, int]]) -> None:
    assert counter_split(ranks_with(values)) is None


def test_unnamed_integer_split_is_only_medium() -> None:
    split = counter_split(ranks_with({0: {"num_tokens": 7}, 1: {"num_tokens": 7}, 2: {"num_tokens": 5}}))
    assert split is not None and split.confidence == "medium"


def test_weak_counter_split_is_a_low_lead_when_nothing_else_decides() -> None:
    stacks = gpu_waiting_ranks(4, lambda r: {"counters": {"train.py:main:num_tokens": 5 if r == 2 else 7}})
    v = analyze(Job(job_id="j", world_size=4, backend="nccl"), stacks, []).verdict
    assert v.suspect_ranks == [2] and v.confidence == "low" and "weak" in v.summary


# -- backend --------------------------------------------------------------------------------------


CUDA_MAPS = frozenset({"/sp/torch/lib/libtorch_cuda.so", "/sp/nvidia/nccl/lib/libnccl.so.2"})


@pytest.mark.parametrize(
    ("signs", "backend"),
    [
        (ProcessSigns(threads=("python", "pt_nccl_watchdg", "pt_nccl_heartbt"), mapped=CUDA_MAPS), "nccl"),
        (ProcessSigns(threads=("python", "pt_gloo_runloop", "pt_gloo_runloop", "gloo_tcp_loop")), "gloo"),
        (ProcessSigns(threads=("pt_nccl_watchdg", "pt_gloo_runloop"), mapped=CUDA_MAPS), "mixed"),
        (ProcessSigns(mapped=CUDA_MAPS | {"/dev/shm/nccl-Ab12Cd (deleted)"}), "nccl"),
        (
            ProcessSigns(
                mapped=CUDA_MAPS,
                fds=("/dev/nvidia0", "/dev/nvidiactl"),
                env={"TORCH_NCCL_BLOCKING_WAIT": "1"},
            ),
            "nccl",
        ),
        (
            ProcessSigns(mapped=CUDA_MAPS, fds=("/dev/nvidia0",)),
            "unknown",
        ),  # a CUDA context, no process group yet
        (ProcessSigns(mapped=CUDA_MAPS), "unknown"),  # a CUDA build of torch proves nothing
        (ProcessSigns(mapped=frozenset({"/sp/torch/lib/libtorch_cpu.so"})), "unknown"),
    ],
)
def test_rank_backend_from_proc_signs(signs: ProcessSigns, backend: str) -> None:
    got, evidence = rank_backend(signs)
    assert got == backend
    if backend != "unknown":
        assert evidence


def test_job_backend_agrees_or_is_mixed() -> None:
    nccl = ("nccl", ["1 pt_nccl_watchdg thread(s)"])
    gloo = ("gloo", ["3 gloo thread(s)"])
    assert job_backend_of({1: nccl, 2: nccl})[0] == "nccl"  # type: ignore[dict-item]
    backend, evidence = job_backend_of({1: nccl, 2: gloo})  # type: ignore[dict-item]
    assert backend == "mixed" and any("ranks differ" in e for e in evidence)
    assert job_backend_of({})[0] is None


# -- GPU utilisation ------------------------------------------------------------------------------

SMI_GPUS = (
    "0, GPU-11111111-aaaa-bbbb-cccc-000000000000, 100\n"
    "1, GPU-22222222-aaaa-bbbb-cccc-000000000000, 100\n"
    "2, GPU-33333333-aaaa-bbbb-cccc-000000000000, 0\n"
    "3, GPU-44444444-aaaa-bbbb-cccc-000000000000, [N/A]\n"
)
SMI_APPS = "4100, GPU-11111111-aaaa-bbbb-cccc-000000000000\n4101, GPU-22222222-aaaa-bbbb-cccc-000000000000\n"


def test_rank_utilisation_by_pid_then_by_device_file() -> None:
    from rankscope.analysis.hang.gpu_busy import parse_apps, parse_gpus, rank_utilisation

    gpus, apps = parse_gpus(SMI_GPUS), parse_apps(SMI_APPS)
    util = rank_utilisation(
        gpus,
        apps,
        {0: 4100, 1: 4101, 2: 4102, 3: 4103},
        {2: ["/dev/nvidiactl", "/dev/nvidia2", "/dev/nvidia-uvm"], 3: ["/dev/nvidia3"]},
    )
    assert util == {0: 100, 1: 100, 2: 0}  # rank 3's GPU reports [N/A]


def test_idle_gpu_among_spinning_ones_names_its_rank_on_nccl() -> None:
    stacks = gpu_waiting_ranks(4, lambda r: {"gpu_util": 3 if r == 2 else 100})
    v = analyze(Job(job_id="j", world_size=4, backend="nccl"), stacks, []).verdict
    assert v.suspect_ranks == [2] and v.confidence == "medium"
    assert "GPU utilisation" in v.summary and "never launched" in v.summary
    # an even split or too few ranks: nothing decided by the GPUs
    from rankscope.analysis.hang.gpu_busy import idle_minority

    assert idle_minority({0: 100, 1: 0}) is None
    assert idle_minority({0: 100, 1: 100, 2: 0, 3: 0}) is None


# -- a job line whose source is not readable here (saved stacks of a job that is gone) ------------

UNREAD = [pyf("train_step", line=47), pyf("main", line=88)]
BARRIER = [
    pyf("barrier", file=SP + "torch/distributed/distributed_c10d.py", line=4890),
    pyf("wrapper", file=SP + "torch/distributed/c10d_logger.py", line=83),
    pyf("save_checkpoint", line=61),
    pyf("main", line=86),
]


def test_c_code_under_an_unread_job_line_may_be_a_gpu_wait_on_nccl_only() -> None:
    kind, how = classify_wait(UNREAD, None, backend="nccl", has_native=False, user_site="train.py:47")
    assert kind == "maybe_gpu" and "train.py:47" in how and "most likely a GPU wait" in how
    for backend in ("gloo", None):
        assert classify_wait(UNREAD, None, backend=backend, has_native=False)[0] == "other"  # type: ignore[arg-type]
    read = classify_wait(UNREAD, None, backend="nccl", has_native=False, user_line="x = y + 1")
    assert read[0] == "other"  # the line was read and does not synchronise
    in_stdlib = [pyf("wait", file="/usr/lib/python3.11/threading.py", line=629), *UNREAD]
    assert classify_wait(in_stdlib, None, backend="nccl", has_native=False)[0] == "other"


def _extra_barrier(backend: str | None) -> tuple[str, list[int], str, str]:
    stacks = [
        RankStack(
            rank=r,
            pid=100 + r,
            host="h",
            state="sleeping",
            threads=[ThreadStack(thread_id=1, is_main=True, frames=BARRIER if r == 2 else UNREAD)],
        )
        for r in range(4)
    ]
    v = analyze(Job(job_id="j", world_size=4, backend=backend), stacks, []).verdict  # type: ignore[arg-type]
    return v.kind, v.suspect_ranks, v.confidence, v.summary


def test_ranks_in_c_code_under_an_unread_line_are_not_blamed_on_nccl() -> None:
    """Faulthandler-style stacks of an NCCL job: ranks 0,1,3 at train.py:47 (``loss.item()`` in a
    file not on this host), rank 2 in an extra barrier. The three are never blamed for where their
    CPU stopped; rank 2, inside a collective no other rank is in, is the lead, at low confidence
    because the others' GPU wait is inferred from a line that cannot be read here."""
    kind, suspects, confidence, summary = _extra_barrier("nccl")
    assert (kind, suspects, confidence) == ("mismatched_collectives", [2], "low")
    assert "ranks 0-1,3 wait in C code, most likely for the GPU" in summary
    assert "issued a collective the others did not" in summary
    kind, suspects, confidence, summary = _extra_barrier(None)
    assert (kind, suspects, confidence) == ("divergent_ranks", [0, 1, 3], "medium")
    assert "if this job runs NCCL that may be a wait for the GPU instead" in summary
    kind, suspects, confidence, summary = _extra_barrier("gloo")
    assert (kind, suspects, confidence) == ("divergent_ranks", [0, 1, 3], "high")
    assert "NCCL" not in summary


def test_creating_communicator_from_native_or_python_frames() -> None:
    from rankscope.analysis.hang.waits import creating_communicator

    assert creating_communicator([nat("pncclCommInitRankConfig"), nat("c10d::NCCLComm::create")])
    assert creating_communicator([nat("c10d::ProcessGroupNCCL::getNCCLComm(std::string const&)")])
    assert creating_communicator(
        [pyf("init_process_group", file=SP + "torch/distributed/distributed_c10d.py")]
    )
    assert creating_communicator([pyf("init_device_mesh", file=SP + "torch/distributed/device_mesh.py")])
    assert not creating_communicator([nat("cudaStreamSynchronize"), pyf("all_reduce"), pyf("main")])
