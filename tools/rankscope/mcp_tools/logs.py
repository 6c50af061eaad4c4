"""MCP tool ``triage_logs``: the same TriageReport as `rankscope triage --json`."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer

from rankscope import api
from rankscope.mcp_tools._common import READ_ONLY, Full, add_tool, arg, guard, in_thread
from rankscope.models.logs import TriageReport


@guard
async def triage_logs(
    paths: Annotated[
        list[str] | None, arg("Log files or directories (per-rank logs, torchrun --log_dir, error.json).")
    ] = None,
    text: Annotated[str | None, arg("Pasted log text, instead of (or with) paths.")] = None,
    max_findings: Annotated[int, arg("Most findings to return, most important first.")] = 50,
    full: Full = False,
) -> TriageReport:
    """Triage the logs of a failed distributed PyTorch job: files, directories of per-rank logs (rank3.log, torchrun --log_dir attempt_0/3/stdout.log), torchelastic error.json.

    Returns findings (collective_timeout, peer_closed, cuda_oom,
    killed_by_signal, ...) with ranks, facts and next steps, and
    suspect_ranks: the ranks most likely at the root (victims that merely saw
    a closed peer or waited in a collective are listed separately).
    """
    report = await in_thread(api.triage_logs, list(paths or []), text=text, max_findings=max_findings)
    if full:
        return report
    from rankscope.analysis.bound import bound_triage

    return bound_triage(report)


def register(server: MCPServer) -> None:
    add_tool(server, triage_logs, title="Triage the logs of a failed job", annotations=READ_ONLY)
