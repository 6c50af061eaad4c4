"""MCP tool ``run_all_ranks``: run a probe script on N ranks and see every rank's output at once.

A thin adapter over ``rankscope.api.run_all_ranks``: it checks the arguments
the way an agent gets them wrong, runs the blocking launch in a worker
thread, and returns the bounded ``RunReport``.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer

from rankscope import api
from rankscope.mcp_tools._common import STARTS_PROCESSES, Full, add_tool, arg, guard, in_thread, progress
from rankscope.models.run import RunReport


@guard
async def run_all_ranks(
    script: Annotated[str, arg("Path of the Python script (absolute, or relative to the server's cwd).")],
    nproc: Annotated[int, arg("Number of ranks (1-64).")] = 2,
    args: Annotated[list[str] | None, arg("The script's own arguments.")] = None,
    timeout: Annotated[float, arg("Seconds for the whole run.")] = 120.0,
    hang_timeout: Annotated[float, arg("Seconds of silence with idle ranks that count as a hang.")] = 30.0,
    full: Full = False,
    ctx: Context[Any, Any] | None = None,
) -> RunReport:
    """Run a Python script on nproc ranks under torchrun on this host and return all ranks' output, collapsed.

    Use it to run a small probe or repro across ranks and see where ranks
    differ: collapsed_stdout lists each line once with the ranks that printed
    it; uniform=false marks lines not printed identically by every rank (look
    there first). outcome is ok, crashed (failed_ranks names them, root_cause
    first), hung (no output and idle ranks for hang_timeout seconds: stacks
    holds every rank's stack and the verdict, read stacks.verdict.kind and
    suspect_ranks) or timeout. Ranks get RANKSCOPE_BACKEND=gloo when there is
    no GPU: write scripts with
    backend = os.environ.get("RANKSCOPE_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo").
    The job is always terminated before the answer returns.
    """
    await progress(ctx, 0, 1, f"running {script} on {nproc} rank(s)")
    report = await in_thread(
        api.run_all_ranks,
        script,
        nproc=nproc,
        args=list(args or []),
        timeout=timeout,
        hang_timeout=hang_timeout,
    )
    await progress(ctx, 1, 1, f"outcome: {report.outcome}")
    return api.answer(report, full=full)


def register(server: MCPServer) -> None:
    add_tool(
        server,
        run_all_ranks,
        title="Run a script on N ranks and collapse their output",
        annotations=STARTS_PROCESSES,
    )
