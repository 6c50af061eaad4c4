"""MCP tools ``inspect_memory`` and ``memory_budget``: evidence for an OOM.

Thin adapters over ``rankscope.api``; both are read-only (they read /proc,
run nvidia-smi with a timeout, unpickle plain-data snapshots).
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from rankscope import api
from rankscope.errors import InvalidInput
from rankscope.mcp_tools._common import READ_ONLY, add_tool, guard, in_thread, progress
from rankscope.models.memory import BudgetReport, MemoryReport


@guard
async def inspect_memory(
    pid: int | None = None,
    paths: list[str] | None = None,
    top: int = 10,
    ctx: Context[Any, Any] | None = None,
) -> MemoryReport:
    """Say what fills memory on each rank: a live job (pid) or CUDA memory snapshot files (paths).

    Call it after an OOM (log triage's cuda_oom finding) or when one rank uses
    more memory than the others. pid (a rank or its launcher, from list_jobs):
    per-rank GPU memory from nvidia-smi (none without NVIDIA drivers: gpu_note
    says so) and host RSS / shared memory / DataLoader-worker memory.
    paths: snapshot pickles from torch.cuda.memory._dump_snapshot or
    rankscope.probe.record_oom_snapshots, or a directory of per-rank files:
    peak and end totals, allocated vs reserved, fragmentation.kind
    (fragmentation: set expandable_segments; exhaustion: hold less), the top
    allocation sites by user frame, leak suspects, and a rank far above the
    others. Read findings first; the playbook is skill/oom.md. top bounds the
    sites listed per snapshot. Next: memory_budget to check the sharding plan.
    """
    if pid is not None and pid <= 0:
        raise InvalidInput(f"pid must be a positive process id, got {pid}.", fix="Pass a pid from list_jobs.")
    if top < 1 or top > 200:
        raise InvalidInput(f"top must be between 1 and 200, got {top}.", fix="Pass top=10 (the default).")
    what = f"{len(paths)} snapshot path(s)" if paths else f"job of pid {pid}"
    await progress(ctx, 0, 1, f"reading {what}")
    report = await in_thread(api.inspect_memory, pid, paths, top=top)
    await progress(ctx, 1, 1, f"{len(report.findings)} finding(s)")
    return report


@guard
async def memory_budget(
    placement: str,
    optimizer: str = "adam",
    param_dtype: str = "float32",
    grad_dtype: str | None = None,
    optim_dtype: str = "float32",
    gpu_memory: str | None = None,
    world_size: int | None = None,
) -> BudgetReport:
    """Per-rank bytes of parameters, gradients and optimizer states for a sharding plan, and whether it fits.

    placement: path to a placement report JSON (rankscope.probe.dump(model,
    dir, kind='placements'), `rankscope placements CKPT --json`, or a
    {"world_size": N, "params": [{fqn, shape, local_shape, dtype, placements,
    unit}]} file). Compares the plan as given with DDP, FSDP with per-layer
    units and FSDP wrapped at the root only; allgather_peak_bytes is the
    largest unit unsharded. optimizer: adam, adamw, sgd, adagrad, ... or the
    number of state tensors per element. gpu_memory: e.g. '80GiB' to get
    fits / headroom_bytes / recommended. world_size: needed when the input
    does not say (DCP checkpoints). Activations are not included: headroom
    must cover them.
    """
    return await in_thread(
        api.memory_budget,
        placement,
        optimizer=optimizer,
        param_dtype=param_dtype,
        grad_dtype=grad_dtype,
        optim_dtype=optim_dtype,
        gpu_memory=gpu_memory,
        world_size=world_size,
    )


def register(server: MCPServer) -> None:
    add_tool(
        server, inspect_memory, title="Memory per rank, live or from CUDA snapshots", annotations=READ_ONLY
    )
    add_tool(server, memory_budget, title="Per-rank memory budget of a sharding plan", annotations=READ_ONLY)
