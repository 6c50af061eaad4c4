"""MCP tools ``inspect_memory`` and ``memory_budget``: evidence for an OOM.

Thin adapters over ``rankscope.api``; both are read-only (they read /proc,
run nvidia-smi with a timeout, unpickle plain-data snapshots).
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer

from rankscope import api
from rankscope.mcp_tools._common import READ_ONLY, Full, add_tool, arg, guard, in_thread, progress
from rankscope.models.memory import BudgetReport, MemoryReport


@guard
async def inspect_memory(
    pid: Annotated[int | None, arg("A rank or launcher pid of a live job (list_jobs).")] = None,
    paths: Annotated[
        list[str] | None, arg("CUDA memory snapshot pickles, or a directory of per-rank ones.")
    ] = None,
    top: Annotated[int, arg("Allocation sites listed per snapshot (1-200).")] = 10,
    full: Full = False,
    ctx: Context[Any, Any] | None = None,
) -> MemoryReport:
    """Say what fills memory on each rank: a live job (pid) or CUDA memory snapshot files (paths).

    Call it after an OOM (log triage's cuda_oom finding) or when one rank uses
    more memory than the others. pid: per-rank GPU memory from nvidia-smi (none without NVIDIA drivers: gpu_note
    says so) and host RSS / shared memory / DataLoader-worker memory.
    paths: snapshot pickles from torch.cuda.memory._dump_snapshot or
    rankscope.probe.record_oom_snapshots: peak and end totals, allocated vs reserved, fragmentation.kind
    (fragmentation: set expandable_segments; exhaustion: hold less), the top
    allocation sites by user frame with the script line, leak suspects, and a rank far above the
    others. findings[0] is the one memory finding: memory_leak / memory_rank_only / memory_cannot_fit /
    memory_fragmentation / memory_exhaustion, with rank, site, bytes and its own fix. Read findings first;
    the playbook is skill/oom.md. Next: memory_budget to check the sharding plan.
    """
    what = f"{len(paths)} snapshot path(s)" if paths else f"job of pid {pid}"
    await progress(ctx, 0, 1, f"reading {what}")
    report = await in_thread(api.inspect_memory, pid, paths, top=top)
    await progress(ctx, 1, 1, f"{len(report.findings)} finding(s)")
    return api.answer(report, full=full)


@guard
async def memory_budget(
    placement: Annotated[str, arg("Path of a placement report JSON or a DCP checkpoint's report.")],
    optimizer: Annotated[
        str, arg("adam, adamw, sgd, adagrad, ... or the number of state tensors per element.")
    ] = "adam",
    param_dtype: Annotated[str, arg("Parameter dtype, e.g. bfloat16.")] = "float32",
    grad_dtype: Annotated[str | None, arg("Gradient dtype (default: the parameters').")] = None,
    optim_dtype: Annotated[str, arg("Optimizer state dtype.")] = "float32",
    gpu_memory: Annotated[str | None, arg("Memory per GPU, e.g. '80GiB': says whether it fits.")] = None,
    world_size: Annotated[int | None, arg("Needed when the input does not say (DCP checkpoints).")] = None,
    full: Full = False,
) -> BudgetReport:
    """Per-rank bytes of parameters, gradients and optimizer states for a sharding plan, and whether it fits.

    The placement report: rankscope.probe.dump(model, dir, kind='placements'),
    `rankscope placements CKPT --json`, or a {"world_size": N, "params": [{fqn,
    shape, local_shape, dtype, placements, unit}]} file. Compares the plan as given with DDP, FSDP with per-layer
    units and FSDP wrapped at the root only; allgather_peak_bytes is the
    largest unit unsharded. Activations are not included: headroom
    must cover them.
    """
    report = await in_thread(
        api.memory_budget,
        placement,
        optimizer=optimizer,
        param_dtype=param_dtype,
        grad_dtype=grad_dtype,
        optim_dtype=optim_dtype,
        gpu_memory=gpu_memory,
        world_size=world_size,
    )
    return api.answer(report, full=full)


def register(server: MCPServer) -> None:
    add_tool(
        server, inspect_memory, title="Memory per rank, live or from CUDA snapshots", annotations=READ_ONLY
    )
    add_tool(server, memory_budget, title="Per-rank memory budget of a sharding plan", annotations=READ_ONLY)
