"""Build py-spy JSON dumps shaped like real NCCL hangs (no GPU here to capture them).

Every frame name comes from the torch 2.13 / CUDA / NCCL sources and from public dumps of
NCCL hangs (pytorch/pytorch#95944, NVIDIA/nccl#585, huggingface/accelerate#3104): what
py-spy shows for ``.item()``, ``dist.barrier()``, a DataLoader wait and model compute, with
and without ``--native`` and ``--locals``. The CUDA wait spins, so a GPU-waiting rank's
innermost frames are libcuda addresses and ``clock_gettime``, and its state is ``running``.

Run ``python tests/data/stacks/nccl/build.py`` to rewrite the JSON files beside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SP = "/opt/conda/lib/python3.11/site-packages/"
TRAIN = "/workspace/train.py"
LIBCUDART = SP + "nvidia/cuda_runtime/lib/libcudart.so.12"
LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
LIBTORCH_CUDA = SP + "torch/lib/libtorch_cuda.so"
LIBTORCH_CPU = SP + "torch/lib/libtorch_cpu.so"
LIBTORCH_PY = SP + "torch/lib/libtorch_python.so"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"

# train.py, as the job runs it (the line numbers below point into it)
SOURCE = {
    38: "batch = next(it)",
    44: "dist.barrier()  # log_metrics: only when this rank logs",
    47: "loss_value = loss.item()",
    48: "log_metrics(loss)",
    50: "dist.barrier()",
    60: "out = model(x)",
    75: "evaluate(model, val_loader)",
}


def py(name: str, file: str, line: int, local_vars: dict[str, Any] | None = None) -> dict[str, Any]:
    locs = (
        [{"name": k, "addr": 0, "arg": False, "repr": repr(v)} for k, v in local_vars.items()]
        if local_vars is not None
        else None
    )
    return {
        "name": name,
        "filename": file,
        "module": None,
        "short_filename": file.rsplit("/", 1)[-1],
        "line": line,
        "locals": locs,
        "is_entry": False,
        "is_shim_entry": False,
    }


def native(name: str, lib: str) -> dict[str, Any]:
    return {
        "name": name,
        "filename": lib,
        "module": lib,
        "short_filename": lib.rsplit("/", 1)[-1],
        "line": 0,
        "locals": None,
        "is_entry": True,
        "is_shim_entry": True,
    }


def spin() -> list[dict[str, Any]]:
    """A spinning CUDA wait: vdso clock_gettime under unsymbolised libcuda addresses."""
    return [
        native("clock_gettime", LIBC),
        native("0x7f3a9c2b41d7", LIBCUDA),
        native("0x7f3a9c1e0a52", LIBCUDA),
    ]


def item_native() -> list[dict[str, Any]]:
    """``loss.item()`` on a CUDA tensor in torch 2.13 (innermost first)."""
    return [
        *spin(),
        native("cudaStreamSynchronize", LIBCUDART),
        native("at::native::_local_scalar_dense_cuda(at::Tensor const&)", LIBTORCH_CUDA),
        native("at::_ops::_local_scalar_dense::call(at::Tensor const&)", LIBTORCH_CPU),
        native("at::native::item(at::Tensor const&)", LIBTORCH_CPU),
        native("torch::autograd::THPVariable_item(_object*, _object*)", LIBTORCH_PY),
    ]


def barrier_native() -> list[dict[str, Any]]:
    """``dist.barrier()`` on NCCL in torch 2.13: the stream sync inside ProcessGroupNCCL::barrier."""
    return [
        *spin(),
        native("cudaStreamSynchronize", LIBCUDART),
        native("c10::cuda::CUDAStream::synchronize() const", LIBTORCH_CUDA),
        native("c10d::ProcessGroupNCCL::barrier(c10d::BarrierOptions const&)", LIBTORCH_CUDA),
        native(
            "c10d::ops::(anonymous namespace)::barrierCUDA(at::Tensor, "
            "c10::intrusive_ptr<c10d::ProcessGroup> const&, std::vector<long> const&, bool, long)",
            LIBTORCH_CUDA,
        ),
    ]


def barrier_py(user: int, counters: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [
        py(
            "barrier",
            SP + "torch/distributed/distributed_c10d.py",
            5349,
            {} if counters is not None else None,
        ),
        py("wrapper", SP + "torch/distributed/c10d_logger.py", 83, {} if counters is not None else None),
        *(
            [
                py(
                    "log_metrics",
                    TRAIN,
                    44,
                    {"loss": "tensor(0.31, device='cuda:2')"} if counters is not None else None,
                )
            ]
            if user == 44
            else []
        ),
        py("main", TRAIN, 48 if user == 44 else user, counters),
    ]


def dataloader_py(counters: dict[str, Any] | None) -> list[dict[str, Any]]:
    loc = {} if counters is not None else None
    dl = SP + "torch/utils/data/dataloader.py"
    return [
        py("_PollLikeSelector.select", "/opt/conda/lib/python3.11/selectors.py", 415, loc),
        py("wait", "/opt/conda/lib/python3.11/multiprocessing/connection.py", 1136, loc),
        py("Connection._poll", "/opt/conda/lib/python3.11/multiprocessing/connection.py", 440, loc),
        py("Connection.poll", "/opt/conda/lib/python3.11/multiprocessing/connection.py", 257, loc),
        py("Queue.get", "/opt/conda/lib/python3.11/multiprocessing/queues.py", 113, loc),
        py("_MultiProcessingDataLoaderIter._try_get_data", dl, 1275, loc),
        py("_MultiProcessingDataLoaderIter._get_data", dl, 1441, loc),
        py("_MultiProcessingDataLoaderIter._next_data", dl, 1468, loc),
        py("_BaseDataLoaderIter.__next__", dl, 734, loc),
        py("main", TRAIN, 38, counters),
    ]


def dataloader_native() -> list[dict[str, Any]]:
    return [native("poll", LIBC)]


def eval_py(counters: dict[str, Any] | None) -> list[dict[str, Any]]:
    loc = {} if counters is not None else None
    mod = SP + "torch/nn/modules/"
    return [
        py("Linear.forward", mod + "linear.py", 134, loc),
        py("Module._call_impl", mod + "module.py", 1786, loc),
        py("Module._wrapped_call_impl", mod + "module.py", 1775, loc),
        py("evaluate", TRAIN, 60, {"batch_idx": 17} if counters is not None else None),
        py("main", TRAIN, 75, counters),
    ]


def eval_native() -> list[dict[str, Any]]:
    return [
        native("0x7f3a1d2e3f40", SP + "nvidia/cublas/lib/libcublasLt.so.12"),
        native(
            "at::cuda::blas::gemm_internal<float>(char, char, long, long, long, float, float const*, long, "
            "float const*, long, float, float*, long)",
            LIBTORCH_CUDA,
        ),
        native(
            "at::native::(anonymous namespace)::addmm_out_cuda_impl(at::Tensor&, at::Tensor const&, "
            "at::Tensor const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&, "
            "at::native::Activation)",
            LIBTORCH_CUDA,
        ),
    ]


def item_py(counters: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [py("main", TRAIN, 47, counters)]


def thread(pid: int, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The main thread plus the NCCL watchdog and heartbeat threads every NCCL rank runs."""
    helper = [native("pthread_cond_timedwait", LIBC)]
    return [
        {
            "pid": pid,
            "thread_id": 140000000000000 + pid,
            "thread_name": "MainThread",
            "os_thread_id": pid,
            "active": True,
            "owns_gil": False,
            "frames": frames,
        },
        {
            "pid": pid,
            "thread_id": 140000000000001 + pid,
            "thread_name": "pt_nccl_watchdg",
            "os_thread_id": pid + 40,
            "active": False,
            "owns_gil": False,
            "frames": helper,
        },
        {
            "pid": pid,
            "thread_id": 140000000000002 + pid,
            "thread_name": "pt_nccl_heartbt",
            "os_thread_id": pid + 41,
            "active": False,
            "owns_gil": False,
            "frames": helper,
        },
    ]


def merge(
    native_frames: list[dict[str, Any]], python_frames: list[dict[str, Any]], with_native: bool
) -> list[dict[str, Any]]:
    """py-spy --native puts the C frames of the innermost Python call first."""
    return [*native_frames, *python_frames] if with_native else python_frames


def job(world: int, backend: str | None) -> dict[str, Any]:
    ranks = [
        {
            "rank": r,
            "local_rank": r,
            "pid": 4100 + r,
            "host": "gpu-node-07",
            "state": "running",
            "launcher": "torchrun",
            "rank_source": "env:RANK",
            "cmdline": ["/opt/conda/bin/python", "-u", TRAIN],
            "children": [],
            "backend": backend,
        }
        for r in range(world)
    ]
    return {
        "job_id": "torchrun:gpu-node-07:29500",
        "launcher": "torchrun",
        "launcher_pid": 4090,
        "world_size": world,
        "master_addr": "gpu-node-07",
        "master_port": 29500,
        "hosts": ["gpu-node-07"],
        "ranks": ranks,
        "backend": backend,
        "backend_evidence": ["pid 4100: 1 pt_nccl_watchdg thread(s): 1 NCCL process group(s)"]
        if backend
        else [],
    }


def case(
    name: str,
    shapes: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]], str]],
    *,
    with_native: bool,
    with_locals: bool,
    backend: str | None,
    doc: str,
) -> None:
    ranks = []
    for rank, (nat, pyf, state) in sorted(shapes.items()):
        pid = 4100 + rank
        ranks.append(
            {
                "rank": rank,
                "pid": pid,
                "host": "gpu-node-07",
                "state": state,
                "pyspy": thread(pid, merge(nat, pyf, with_native)),
            }
        )
    out = {
        "case": name,
        "doc": doc,
        "native": with_native,
        "locals": with_locals,
        "job": job(len(shapes), backend),
        "ranks": ranks,
        "source": {f"{TRAIN}:{line}": text for line, text in SOURCE.items()},
    }
    (HERE / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")


def build() -> None:
    for with_native in (False, True):
        for with_locals in (False, True):
            suffix = ("_native" if with_native else "") + ("_locals" if with_locals else "")
            lag: dict[str, Any] | None = {"step": 3, "rank": 2} if with_locals else None
            ahead: dict[int, dict[str, Any] | None] = {
                r: ({"step": 10, "rank": r} if with_locals else None) for r in (0, 1, 3)
            }
            # rank 2 took an extra barrier at step 3; NCCL let the others run on to step 10
            case(
                f"extra_barrier{suffix}",
                {
                    0: (item_native(), item_py(ahead[0]), "running"),
                    1: (barrier_native(), barrier_py(50, ahead[1]), "running"),
                    2: (barrier_native(), barrier_py(44, lag), "running"),
                    3: (barrier_native(), barrier_py(50, ahead[3]), "running"),
                },
                with_native=with_native,
                with_locals=with_locals,
                backend="nccl",
                doc="rank 2 called an extra barrier() at step 3; ranks 1 and 3 wait in the step-10 barrier, "
                "rank 0 in loss.item() at step 10. Culprit: rank 2.",
            )
    for with_native in (False, True):
        suffix = "_native" if with_native else ""
        case(
            f"dataloader{suffix}",
            {
                0: (item_native(), item_py(None), "running"),
                1: (item_native(), item_py(None), "running"),
                2: (dataloader_native(), dataloader_py(None), "sleeping"),
                3: (item_native(), item_py(None), "running"),
            },
            with_native=with_native,
            with_locals=False,
            backend="nccl",
            doc="ranks 0, 1, 3 wait for the GPU in loss.item(); rank 2 waits for a DataLoader worker and "
            "never issued the step's all_reduce. Culprit: rank 2.",
        )
        case(
            f"barrier_eval{suffix}",
            {
                0: (barrier_native(), barrier_py(50, None), "running"),
                1: (barrier_native(), barrier_py(50, None), "running"),
                2: (barrier_native(), barrier_py(50, None), "running"),
                3: (eval_native(), eval_py(None), "running"),
            },
            with_native=with_native,
            with_locals=False,
            backend="nccl",
            doc="ranks 0-2 wait in the barrier after evaluation; rank 3 is still in its evaluation loop "
            "(it evaluates more batches). Culprit: rank 3.",
        )
    same = {r: (item_native(), item_py({"step": 7, "rank": r}), "running") for r in range(4)}
    case(
        "all_item_native_locals",
        same,
        with_native=True,
        with_locals=True,
        backend="nccl",
        doc="every rank waits for the GPU in loss.item() at step 7: the CPU side cannot tell; "
        "the flight recorder can.",
    )


if __name__ == "__main__":
    build()
