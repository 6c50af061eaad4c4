"""What each rank's main thread waits for: a collective, the GPU, the launch queue, the allocator, or none.

Under gloo a collective blocks the CPU until every rank arrives, so where the CPU stops is
where the rank is stuck. Under NCCL a collective returns once its kernel is enqueued, and a
hung rank's CPU stops at the next point that waits for the GPU: ``.item()``, ``.cpu()``,
``torch.cuda.synchronize()``, a full launch queue, the caching allocator. A rank waiting for
the GPU is queued behind a stuck kernel and is probably innocent; a rank that waits for none
of these while its peers wait for the GPU is the prime suspect.

Native frames (``--native``) decide; with Python frames alone the innermost user line
decides when it calls a synchronising method, and the evidence says it is inferred. Frame
names come from the torch 2.13 / CUDA / NCCL sources (see skill/hangs.md#nccl-hangs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rankscope.analysis.hang.frames import is_user_frame
from rankscope.models.core import Backend, Frame, WaitKind

COMM_INIT_NATIVE = r"broadcastUniqueNCCLID|ncclCommInitRank|NCCLComm::create|initNCCLComm"
"""Native frames of a rank creating an NCCL communicator."""

# Native frames, innermost first in a stack; the first match wins.
_NATIVE_WAITS: tuple[tuple[re.Pattern[str], WaitKind, str], ...] = (
    # communicator init and rendezvous: a CPU-visible wait with gloo semantics
    (
        re.compile(rf"{COMM_INIT_NATIVE}|c10d::TCPStore::(get|wait)"),
        "collective",
        "communicator init / TCPStore wait",
    ),
    # NCCL's sync barrier and the blocking-wait poll block the CPU inside the collective
    (re.compile(r"ProcessGroupNCCL::barrier"), "collective", "ProcessGroupNCCL::barrier"),
    (re.compile(r"ProcessGroupNCCL::WorkNCCL::wait"), "collective", "WorkNCCL::wait (blocking wait)"),
    (re.compile(r"ProcessGroupGloo|gloo::"), "collective", "gloo"),
    # the caching allocator synchronises or frees under memory pressure
    (
        re.compile(
            r"CachingAllocator|synchronize_and_free_events|release_cached_blocks|cudaFree\b|cuMemFree"
        ),
        "allocator",
        "CUDA caching allocator",
    ),
    # a launch blocked behind a hung kernel: the stream's queue is full
    (
        re.compile(
            r"cudaLaunchKernel|cuLaunchKernel|ncclLaunchKernel|ncclGroupEnd|cudaLaunchCooperativeKernel"
        ),
        "launch_queue",
        "kernel launch",
    ),
    # the CPU waits for queued GPU work
    (
        re.compile(
            r"cudaStreamSynchronize|cuStreamSynchronize|cudaDeviceSynchronize|cuCtxSynchronize|"
            r"cudaEventSynchronize|cuEventSynchronize|cudaMemcpy(?!Async)|cudaMemcpyAsync|cuMemcpyDtoH|"
            r"_local_scalar_dense_cuda|copy_kernel_cuda|memcpy_and_sync|device_synchronize|"
            r"CUDAStream::synchronize|cudaStreamWaitEvent"
        ),
        "gpu",
        "GPU synchronisation",
    ),
)

# Python frames of torch that wait for the GPU (py-spy shows them without --native); the
# flag says whether the frame waits for the GPU on any backend (torch.cuda) or only when
# the tensors live on the GPU, as on an NCCL job (printing, tolist, the object collectives).
_PY_GPU_FRAMES: tuple[tuple[str, str, bool], ...] = (
    ("torch/cuda/__init__.py", "synchronize", True),
    ("torch/cuda/streams.py", "synchronize", True),
    ("torch/_tensor_str.py", "_tensor_str", False),
    ("torch/_tensor_str.py", "_str", False),
    ("torch/_tensor.py", "tolist", False),
    ("torch/_tensor.py", "__repr__", False),
    ("torch/distributed/distributed_c10d.py", "_object_to_tensor", False),
    ("torch/distributed/distributed_c10d.py", "_tensor_to_object", False),
)

# A user line that synchronises with the GPU when its tensor lives there.
_SYNC_CALL = re.compile(
    r"\.item\(\)|\.cpu\(\)|\.tolist\(\)|\.numpy\(\)|\.to\(\s*['\"]cpu|synchronize\(|\bfloat\(|\bint\(|\bbool\(|"
    r"\.nonzero\(|torch\.unique\(|"
    # a copy to the GPU from pageable memory waits for the stream's earlier work (not with non_blocking=True)
    r"\.cuda\((?![^)]*non_blocking\s*=\s*True)|\.to\(\s*(['\"]cuda|device\b|[\w.]*\.device\b)(?![^)]*non_blocking\s*=\s*True)"
)

GPU_LIKE: frozenset[str] = frozenset({"gpu", "launch_queue", "allocator", "maybe_gpu"})
"""Waits that mean "queued behind the GPU": on NCCL, not where the rank is stuck. ``maybe_gpu``
counts: a rank that may be queued behind the GPU is never blamed for where its CPU stopped."""


_PRIORITY: tuple[WaitKind, ...] = ("collective", "allocator", "launch_queue", "gpu")


def _native_wait(frames: Sequence[Frame]) -> tuple[WaitKind, str] | None:
    """The wait the native frames show, by what the frames are inside of.

    The frame that explains the wait may be outside the one that spins: NCCL's barrier
    waits in ``cudaStreamSynchronize`` *inside* ``ProcessGroupNCCL::barrier`` (that rank has
    reached the barrier), and the caching allocator frees memory in ``cudaEventSynchronize``.
    So a CPU-blocking collective anywhere in the stack decides first, then the allocator, then
    a kernel launch, then a plain GPU sync.
    """
    native = [f for f in frames if f.native]
    for want in _PRIORITY:
        for frame in native:
            for pattern, kind, label in _NATIVE_WAITS:
                if kind == want and pattern.search(frame.function):
                    return kind, f"native frame {frame.function} ({label})"
    return None


def _python_gpu_frame(frames: Sequence[Frame], on_gpu: bool) -> Frame | None:
    for frame in frames:
        if frame.native:
            continue
        path = frame.file.replace("\\", "/")
        for frag, func, always in _PY_GPU_FRAMES:
            if not (always or on_gpu) or not path.endswith(frag):
                continue
            if frame.function == func or frame.function.endswith("." + func):
                return frame
    return None


_CREATING_COMM = re.compile(
    rf"{COMM_INIT_NATIVE}|ncclCommInit|getNCCLComm|init_process_group|new_group|new_subgroups|init_device_mesh"
    r"|split_group"
)


def creating_communicator(frames: Sequence[Frame]) -> bool:
    """Whether a thread is creating a communicator or process group (native or Python frames): the
    moment when an NCCL RAS status query has crashed jobs (NVIDIA/nccl#2346)."""
    return any(_CREATING_COMM.search(f.function) for f in frames)


def under_own_line(frames: Sequence[Frame]) -> Frame | None:
    """The job's own frame a thread read from Python frames alone stops in, when it is the innermost
    one: the thread runs C code called from that line (a GPU sync, a lock, a sleep: the line says).
    None with native frames, or when the innermost frame is torch's or a library's."""
    if not frames or any(f.native for f in frames):
        return None
    return frames[0] if is_user_frame(frames[0]) else None


def classify_wait(
    frames: Sequence[Frame],
    op: str | None,
    *,
    backend: Backend | None,
    has_native: bool,
    user_line: str | None = None,
    user_site: str | None = None,
) -> tuple[WaitKind, str]:
    """The wait kind of one main thread and how it was read.

    ``op`` is the torch.distributed operation recognised in the frames, ``user_line`` the
    source text of the innermost user frame (read by the shell) and ``user_site`` its
    ``file:line``. Without native frames a GPU wait is inferred from the user line, and the
    evidence says so; a collective frame on an NCCL job without native frames is still a
    ``collective`` (the enqueue itself can block: communicator init, a full launch queue).
    """
    native = _native_wait(frames) if has_native else None
    if native is not None:
        return native
    # the tensors may live on a GPU unless the job is known to run gloo alone: a CPU tensor's
    # .item() never blocks, so a rank seen at one is waiting for a device either way
    on_gpu = backend != "gloo"
    torch_frame = _python_gpu_frame(frames, on_gpu)
    if torch_frame is not None:
        how = "" if has_native else "; --native confirms"
        return (
            "gpu",
            f"frame {torch_frame.function} ({torch_frame.file.rsplit('/', 1)[-1]}) waits for the GPU{how}",
        )
    if op is not None:
        return "collective", f"in {op}"
    if on_gpu and user_line is not None and _SYNC_CALL.search(user_line):
        where = f" at {user_site}" if user_site else ""
        known = "" if backend in ("nccl", "mixed") else " (backend not read: assumed on a GPU)"
        return (
            "gpu",
            f"{_INFERRED}: `{user_line.strip()[:80]}`{where} synchronises with the GPU{known}; --native confirms",
        )
    own = under_own_line(frames)
    if backend in ("nccl", "mixed") and user_line is None and own is not None:
        where = user_site or f"{own.file.rsplit('/', 1)[-1]}:{own.line}"
        return (
            "maybe_gpu",
            f"{_INFERRED}: the innermost frame is the job's own line {where}, in C code called from it, and "
            "that line is not readable here; on NCCL that is most likely a GPU wait (.item(), .cpu(), "
            "synchronize()); --native, or the line, decides",
        )
    return "other", "no collective and no GPU wait in the frames" + (
        "" if has_native else f" ({_PYTHON_ONLY}; --native shows GPU waits)"
    )


_INFERRED = "inferred"
_PYTHON_ONLY = "Python frames only"


def inferred(evidence: str | None) -> bool:
    """Whether :func:`classify_wait`'s evidence says the wait was inferred from the job's line, not
    read from a frame that waits: a GPU wait the hang verdict is then less sure of."""
    return _INFERRED in (evidence or "")


def python_frames_only(evidence: str | None) -> bool:
    """Whether :func:`classify_wait`'s evidence says a wait for neither was read from Python frames
    alone: a kernel launch blocked under a Python call would not show there."""
    return _PYTHON_ONLY in (evidence or "")


def wait_phrase(kind: str) -> str:
    """How a summary names a wait kind."""
    return {
        "gpu": "wait for the GPU",
        "launch_queue": "are blocked launching a kernel (the GPU's queue is full)",
        "allocator": "wait in the CUDA caching allocator",
        "collective": "wait in a collective",
        "maybe_gpu": "wait in C code, most likely for the GPU (the line is not readable here)",
        "other": "wait for neither a collective nor the GPU",
    }.get(kind, kind)
