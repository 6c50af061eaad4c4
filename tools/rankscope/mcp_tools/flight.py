"""MCP tool ``analyze_flight_recorder``: diagnose a hang from per-rank flight-recorder dumps."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer

from rankscope import api
from rankscope.errors import InvalidInput
from rankscope.mcp_tools._common import READ_ONLY, Full, add_tool, arg, guard, in_thread, progress
from rankscope.models.flight import FlightReport


@guard
async def analyze_flight_recorder(
    paths: Annotated[list[str], arg("The dump directory, or dump files (one per rank).")],
    stacks_report: Annotated[
        str | None, arg("A `rankscope stacks --json` file to merge with the dumps.")
    ] = None,
    full: Full = False,
    ctx: Context[Any, Any] | None = None,
) -> FlightReport:
    """Read per-rank flight-recorder dumps (NCCL or Gloo, pickle or JSON) and name the first collective where the ranks disagree.

    Use it when the job already died or timed out and left dumps
    (TORCH_FR_DUMP_TEMP_FILE=<dir>/<prefix> writes <prefix><rank>; or
    rankscope.probe.enable_flight_recorder(dump_dir) + SIGUSR1 on a hung
    job). Partial rank sets and unreadable files are fine: they are listed
    in missing_ranks / errors.
    verdict.kind: divergent_ranks (suspects never entered a collective the
    others entered), mismatched_collectives (different op, sizes or dtypes
    at the same sequence id), missing_ranks (no dump from them),
    all_in_same_collective, no_collective, inconclusive. first_mismatch holds
    each rank's entry and the recorded stack.
    """
    if not paths:
        raise InvalidInput("paths is empty.", fix="Pass the dump directory, e.g. ['/tmp/fr_dumps'].")
    await progress(ctx, 0, 1, f"reading dumps under {', '.join(paths[:3])}")
    report = await in_thread(api.analyze_flight_recorder, list(paths), stacks_report=stacks_report)
    await progress(ctx, 1, 1, f"verdict: {report.verdict.kind}")
    return api.answer(report, full=full)


def register(server: MCPServer) -> None:
    add_tool(
        server,
        analyze_flight_recorder,
        title="First collective where ranks disagree, from flight-recorder dumps",
        annotations=READ_ONLY,
    )
