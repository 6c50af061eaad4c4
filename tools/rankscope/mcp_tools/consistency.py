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
        str,
        arg(
            "The folder the ranks saved to (checkpoints, optimizer states, probe dumps), or the job's folder holding it."
        ),
    ],
    atol: Annotated[float, arg("Absolute tolerance (0: bitwise).")] = 0.0,
    rtol: Annotated[float, arg("Relative tolerance (0: bitwise).")] = 0.0,
    full: Full = False,
) -> ConsistencyReport:
    """Ranks disagree (results or loss differ on one rank): compare what each rank saved, the cause first.

    The files: torch.save'd checkpoints, state_dicts or optimizer states with the
    rank in the name (model_rank3.pt, optim_rank3.pt) or in a folder (rank3/), or the
    fingerprints of rankscope.probe.dump(model, DIR). causes[0] names the rank and
    what it sees: a step counter behind the others', a file of another run or
    model, keys some ranks lack, a file much older than the others', NaN/Inf;
    divergent lists, in module order, the tensors whose ranks disagree with the
    majority. With no per-rank file, the error says what to add to a live job.
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
