"""MCP tool ``triage_logs``: the same TriageReport as `rankscope triage --json`."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from rankscope import api
from rankscope.mcp_tools._common import READ_ONLY, guard
from rankscope.models.logs import TriageReport


def register(server: MCPServer) -> None:
    @server.tool(
        name="triage_logs",
        description=(
            "Triage the logs of a failed distributed PyTorch job: files, directories of per-rank logs "
            "(rank3.log, torchrun --log_dir attempt_0/3/stdout.log), torchelastic error.json. Returns findings "
            "(collective_timeout, peer_closed, cuda_oom, killed_by_signal, ...) with ranks, facts and next steps, "
            "and suspect_ranks: the ranks most likely at the root (victims that merely saw a closed peer or "
            "waited in a collective are listed separately). Pass `text` to triage pasted log text instead."
        ),
        annotations=READ_ONLY,
    )
    @guard
    def triage_logs(paths: list[str], text: str | None = None, max_findings: int = 50) -> TriageReport:
        return api.triage_logs(paths, text=text, max_findings=max_findings)
