"""Recognition tables: which frames mean "blocked in a torch.distributed operation".

Names come from the PyTorch source (torch 2.x): ``torch/distributed/distributed_c10d.py``,
``_functional_collectives.py``, ``fsdp/_fully_shard/_fsdp_collectives.py`` and
``_fsdp_param_group.py`` (FSDP2), ``fsdp/_runtime_utils.py`` and ``_flat_param.py``
(FSDP1), ``tensor/_redistribute.py`` and ``_collective_utils.py`` (DTensor),
``nn/parallel/distributed.py`` and the C++ ``c10d::Reducer`` (DDP).

py-spy reports Python 3.11+ functions by qualified name (``FSDPParamGroup.unshard``),
so tables hold qualified names and match on the last component as well. Lookups are
memoised: the ranks of one job share almost all their frames.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# c10d Python API (distributed_c10d.py): function name -> operation name.
C10D_OPS: frozenset[str] = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "broadcast",
        "barrier",
        "monitored_barrier",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_single",
        "all_gather_coalesced",
        "_all_gather_base",
        "all_gather_object",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_single",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "all_to_all",
        "all_to_all_single",
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "broadcast_object_list",
        "send_object_list",
        "recv_object_list",
        "new_group",
        "new_subgroups",
        "destroy_process_group",
        "init_process_group",
    }
)

# torch.distributed._functional_collectives: the waits block, the issuing calls mostly do not.
FUNCTIONAL_OPS: dict[str, str] = {
    "wait_tensor": "wait_tensor",
    "AsyncCollectiveTensor.wait": "wait_tensor",
    "_maybe_wrap_tensor": "wait_tensor",
    "all_reduce": "functional.all_reduce",
    "all_gather_tensor": "functional.all_gather_tensor",
    "reduce_scatter_tensor": "functional.reduce_scatter_tensor",
    "all_to_all_single": "functional.all_to_all_single",
    "broadcast": "functional.broadcast",
}

# Higher-level paths: (file fragment, qualified function) -> (framework, phase).
FRAMEWORK_FRAMES: dict[tuple[str, str], tuple[str, str]] = {
    # FSDP2 (fully_shard)
    ("fsdp/_fully_shard/_fsdp_collectives.py", "foreach_all_gather"): ("FSDP2", "all_gather"),
    ("fsdp/_fully_shard/_fsdp_collectives.py", "foreach_all_gather_copy_out"): ("FSDP2", "all_gather"),
    ("fsdp/_fully_shard/_fsdp_collectives.py", "foreach_reduce"): ("FSDP2", "reduce_scatter"),
    ("fsdp/_fully_shard/_fsdp_param_group.py", "FSDPParamGroup.unshard"): ("FSDP2", "unshard"),
    ("fsdp/_fully_shard/_fsdp_param_group.py", "FSDPParamGroup.wait_for_unshard"): ("FSDP2", "unshard"),
    ("fsdp/_fully_shard/_fsdp_param_group.py", "FSDPParamGroup.reshard"): ("FSDP2", "reshard"),
    ("fsdp/_fully_shard/_fsdp_param_group.py", "FSDPParamGroup.post_backward"): ("FSDP2", "reduce_scatter"),
    ("fsdp/_fully_shard/_fsdp_param_group.py", "FSDPParamGroup.pre_backward"): ("FSDP2", "unshard"),
    # FSDP1 (FullyShardedDataParallel)
    ("fsdp/_runtime_utils.py", "_unshard"): ("FSDP", "unshard"),
    ("fsdp/_runtime_utils.py", "_reshard"): ("FSDP", "reshard"),
    ("fsdp/_runtime_utils.py", "_post_backward_hook"): ("FSDP", "reduce_scatter"),
    ("fsdp/_runtime_utils.py", "_reduce_grad"): ("FSDP", "reduce_scatter"),
    ("fsdp/_runtime_utils.py", "_pre_forward_unshard"): ("FSDP", "unshard"),
    ("fsdp/_flat_param.py", "FlatParamHandle.unshard"): ("FSDP", "unshard"),
    ("fsdp/_flat_param.py", "FlatParamHandle._all_gather_flat_param"): ("FSDP", "all_gather"),
    # DTensor redistribution
    ("tensor/_redistribute.py", "redistribute_local_tensor"): ("DTensor", "redistribute"),
    ("tensor/_redistribute.py", "Redistribute.forward"): ("DTensor", "redistribute"),
    ("tensor/_redistribute.py", "NestedRedistribute.forward"): ("DTensor", "redistribute"),
    ("tensor/_api.py", "DTensor.redistribute"): ("DTensor", "redistribute"),
    ("tensor/_api.py", "DTensor.full_tensor"): ("DTensor", "redistribute"),
    ("tensor/_collective_utils.py", "mesh_broadcast"): ("DTensor", "broadcast"),
    ("tensor/_collective_utils.py", "mesh_scatter"): ("DTensor", "scatter"),
    ("tensor/_collective_utils.py", "shard_dim_alltoall"): ("DTensor", "all_to_all"),
    # Pipeline parallelism (torch.distributed.pipelining): the schedule waits on its
    # batch_isend_irecv work in C++, under no c10d frame of its own
    ("pipelining/schedules.py", "_wait_batch_p2p"): ("PP", "send_recv"),
    ("pipelining/schedules.py", "_batch_p2p"): ("PP", "send_recv"),
    ("pipelining/schedules.py", "_sorted_batch_p2p"): ("PP", "send_recv"),
    # DDP (Python side)
    ("nn/parallel/distributed.py", "DistributedDataParallel.forward"): ("DDP", "forward"),
    ("nn/parallel/distributed.py", "DistributedDataParallel._pre_forward"): ("DDP", "forward"),
    ("nn/parallel/distributed.py", "DistributedDataParallel._sync_buffers"): ("DDP", "broadcast"),
    ("nn/parallel/distributed.py", "DistributedDataParallel._sync_params_and_buffers"): ("DDP", "broadcast"),
    ("nn/parallel/distributed.py", "_sync_module_states"): ("DDP", "broadcast"),
    ("distributed/utils.py", "_sync_module_states"): ("DDP", "broadcast"),
    ("distributed/utils.py", "_sync_params_and_buffers"): ("DDP", "broadcast"),
}

# Autograd entry points: a DDP rank waiting for its gradient all-reduce shows only these
# in Python frames (the Reducer waits in C++ at the end of backward).
BACKWARD_FRAMES: frozenset[str] = frozenset(
    {"Tensor.backward", "backward", "_engine_run_backward", "run_backward", "grad", "autograd.grad"}
)

# Native frames (py-spy --native) that show a rank inside communication.
NATIVE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"c10d::Reducer::"), "ddp.gradient_all_reduce"),
    (re.compile(r"ProcessGroupNCCL::WorkNCCL::(wait|synchronize)"), "Work.wait"),
    (re.compile(r"ProcessGroupGloo::AsyncWork::(wait|synchronize)"), "Work.wait"),
    (re.compile(r"c10d::(Work|ProcessGroup)::wait"), "Work.wait"),
    (re.compile(r"c10d::Work::wait"), "Work.wait"),
    (re.compile(r"_c10d_functional::.*wait_tensor|c10d::wait_tensor"), "wait_tensor"),
    (re.compile(r"ProcessGroupGloo|gloo::"), "gloo"),
    (re.compile(r"ProcessGroupNCCL|nccl[A-Z]|ncclComm"), "nccl"),
    (re.compile(r"c10d::(TCPStore|Store)::|c10d::detail::.*Store"), "store"),
)

# Native op names that identify the collective well enough on their own.
NATIVE_STRONG: frozenset[str] = frozenset({"ddp.gradient_all_reduce", "Work.wait", "wait_tensor"})


@dataclass(frozen=True)
class FrameKind:
    """What one frame tells about communication."""

    op: str | None = None
    framework: str | None = None
    phase: str | None = None


def short_name(function: str) -> str:
    """The last component of a qualified name: ``A.b`` -> ``b``."""
    return function.rsplit(".", 1)[-1]


@functools.lru_cache(maxsize=65536)
def classify_python_frame(function: str, file: str) -> FrameKind:
    """Recognise a c10d / functional / framework frame by file and function name."""
    path = file.replace("\\", "/")
    if "torch/distributed/" not in path and "torch/nn/parallel/" not in path:
        return FrameKind()
    base = short_name(function)
    if path.endswith("torch/distributed/distributed_c10d.py") and base in C10D_OPS:
        return FrameKind(op=base)
    if path.endswith("torch/distributed/_functional_collectives.py"):
        op = FUNCTIONAL_OPS.get(function) or FUNCTIONAL_OPS.get(base)
        if op:
            return FrameKind(op=op)
    for (frag, qual), (fw, phase) in FRAMEWORK_FRAMES.items():
        if path.endswith(frag) and (function == qual or function == short_name(qual)):
            return FrameKind(framework=fw, phase=phase)
    return FrameKind()


@functools.lru_cache(maxsize=65536)
def classify_native_frame(function: str) -> str | None:
    """Map a C++ frame name to a communication marker, or None."""
    for pattern, name in NATIVE_PATTERNS:
        if pattern.search(function):
            return name
    return None


_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")


def frame_key(function: str, file: str, line: int | None) -> tuple[str, str, int]:
    """Identity of a frame across processes: unsymbolised native frames (``0x7f74acea3f16``)
    differ per process (ASLR), so they compare by library alone."""
    if _ADDRESS.match(function):
        return ("?", file, 0)
    return (function, file, line or 0)
