"""``placement_report``: how each parameter and buffer is laid out on this rank, and FSDP coverage.

Local only (no collective): it reads DTensor metadata and module classes. The
coverage math is pure and lives in ``rankscope.analysis.placements``.
"""

from __future__ import annotations

import math
from typing import Any

from rankscope.analysis.placements import coverage
from rankscope.errors import InvalidInput
from rankscope.models.placements import ModuleWrapping, PlacementReport, TensorPlacement
from rankscope.probe import _dist


def _wrapping(module: Any) -> str | None:
    """fsdp2 / fsdp1 / ddp for a wrapped module, by class (fully_shard swaps in an FSDPModule subclass)."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # pragma: no cover - builds without distributed
        return None
    if isinstance(module, FSDPModule):
        return "fsdp2"
    if isinstance(module, FullyShardedDataParallel):
        return "fsdp1"
    if isinstance(module, DistributedDataParallel):
        return "ddp"
    return None


def _describe(fqn: str, t: Any, kind: str, dtensor_cls: Any) -> TensorPlacement:
    elem = t.element_size()
    dtype = str(t.dtype).removeprefix("torch.")
    requires_grad = bool(getattr(t, "requires_grad", False))
    if dtensor_cls is not None and isinstance(t, dtensor_cls):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        mesh = t.device_mesh
        placements = list(t.placements)
        local = t.to_local()
        try:
            _, offset = compute_local_shape_and_global_offset(t.shape, mesh, placements)
            global_offset: list[int] | None = [int(o) for o in offset]
        except Exception:  # private helper: keep the report even if its signature moves
            global_offset = None
        if any(p.is_partial() for p in placements):
            layout = "partial"
        elif any(p.is_shard() for p in placements):
            layout = "sharded"
        else:
            layout = "replicated"
        return TensorPlacement(
            fqn=fqn,
            kind=kind,
            is_dtensor=True,
            layout=layout,
            mesh_shape=list(mesh.shape),
            mesh_dim_names=list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
            placements=[repr(p) for p in placements],
            global_shape=list(t.shape),
            local_shape=list(local.shape),
            global_offset=global_offset,
            dtype=dtype,
            local_bytes=local.numel() * elem,
            global_bytes=math.prod(t.shape) * elem,
            requires_grad=requires_grad,
        )
    nbytes = t.numel() * elem
    return TensorPlacement(
        fqn=fqn,
        kind=kind,
        global_shape=list(t.shape),
        local_shape=list(t.shape),
        global_offset=[0] * t.dim(),
        dtype=dtype,
        local_bytes=nbytes,
        global_bytes=nbytes,
        requires_grad=requires_grad,
    )


def placement_report(model: Any) -> PlacementReport:
    """Per-FQN placements, wrapping per module, and the coverage summary, for this rank."""
    torch = _dist.torch_mod()
    if not isinstance(model, torch.nn.Module):
        raise InvalidInput(
            f"placement_report needs an nn.Module, got {type(model).__name__}",
            fix="Pass the model after fully_shard / parallelize_module / DDP wrapping.",
        )
    dtensor_cls: Any = None
    try:
        from torch.distributed.tensor import DTensor

        dtensor_cls = DTensor
    except ImportError:  # pragma: no cover - builds without distributed
        pass
    tensors = [_describe(n, p, "param", dtensor_cls) for n, p in model.named_parameters()]
    tensors += [_describe(n, b, "buffer", dtensor_cls) for n, b in model.named_buffers()]
    wrapping: list[ModuleWrapping] = []
    modules: list[tuple[str, bool]] = []
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)
    for fqn, mod in model.named_modules():
        kind = _wrapping(mod)
        if kind is not None:
            wrapping.append(ModuleWrapping(fqn=fqn, cls=type(mod).__name__, wrapping=kind))
        modules.append((fqn, isinstance(mod, containers) and kind is None))
    rank, world = _dist.rank_and_world()
    return PlacementReport(
        rank=rank,
        world_size=world,
        job_id=_dist.job_id(),
        host=_dist.hostname(),
        tensors=tensors,
        wrapping=wrapping,
        coverage=coverage(tensors, wrapping, modules),
    )
