"""MCP tools ``check_tensor_consistency`` and ``inspect_placements``: the offline side of the probes.

Thin adapters over ``rankscope.api.compare_dir`` / ``inspect_placements``;
both only read files.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer

from rankscope import api
from rankscope.mcp_tools._common import READ_ONLY, Full, add_tool, arg, guard, in_thread
from rankscope.models.consistency import ConsistencyReport
from rankscope.models.placements import PlacementsReport


@guard
async def check_tensor_consistency(
    path: Annotated[
        str, arg("Directory with one file per rank (fingerprints-rank<R>.json or *_rank<R>.pt).")
    ],
    atol: Annotated[float, arg("Absolute tolerance (0: bitwise).")] = 0.0,
    rtol: Annotated[float, arg("Relative tolerance (0: bitwise).")] = 0.0,
    full: Full = False,
) -> ConsistencyReport:
    """Compare what each rank saved: which tensors differ on which ranks, NaN/Inf per rank, keys on some ranks only.

    The files: fingerprints written in the job by rankscope.probe.dump(model,
    DIR), or torch.save'd state_dicts with the rank in the name. divergent lists,
    in module order, the tensors whose ranks disagree with the majority; the
    first one is where to look. problems names unusable files and files from
    different jobs. Use it for "loss differs between ranks" / "diverges only
    at N GPUs"; see skill/wrong-results.md for what each pattern means.
    """
    return api.answer(await in_thread(api.compare_dir, path, atol=atol, rtol=rtol), full=full)


@guard
async def inspect_placements(
    path: Annotated[str, arg("A DCP checkpoint directory, or placements-rank<R>.json files' directory.")],
    full: Full = False,
) -> PlacementsReport:
    """Show how tensors are sharded in a torch.distributed.checkpoint directory or in saved placement reports.

    Placement reports come from rankscope.probe.dump(model, DIR, kind="placements"). Returns each
    tensor's layout (sharded/whole), global shape and chunks (offsets, sizes,
    storage file), bytes per file, FSDP coverage warnings (placement reports)
    and problems: chunks that overlap or leave part of a tensor missing.
    """
    return api.answer(await in_thread(api.inspect_placements, path), full=full)


def register(server: MCPServer) -> None:
    add_tool(
        server,
        check_tensor_consistency,
        title="Compare per-rank tensors saved by a job",
        annotations=READ_ONLY,
    )
    add_tool(
        server,
        inspect_placements,
        title="Sharding layout of a DCP checkpoint or placement reports",
        annotations=READ_ONLY,
    )
