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
        list[str] | None,
        arg(
            "Files or folders a dead job left, in any mix: logs, torchrun --log_dir, error.json, "
            "flight-recorder dumps, saved stacks (py-spy), CUDA memory snapshots, a watch folder, the script. "
            "A folder is enough."
        ),
    ] = None,
    text: Annotated[str | None, arg("Pasted log text, instead of (or with) paths.")] = None,
    max_findings: Annotated[int, arg("Most findings to return, most important first.")] = 50,
    full: Full = False,
) -> TriageReport:
    """One verdict for a dead distributed PyTorch job from everything it left: logs (rank3.log, torchrun --log_dir attempt_0/3/stdout.log), error.json, flight-recorder dumps, saved stacks and CUDA memory snapshots, read together.

    A watch folder (`watch --out DIR`) leads with its capture of the stall, judged as a live call then; pass it first, then the logs. If a hang may come back, start a watch beside the job.

    Returns suspect_ranks with the summary and evidence (victims that merely
    saw a closed peer or waited in a collective are listed separately),
    decided_by (which source decided: the recorder outranks stacks and logs;
    memory snapshots lead an OOM with rank, site, bytes and pattern),
    playbook (the one skill section to read), each source's own verdict
    (flight, stacks), and findings (collective_timeout read per rank,
    duplicate_gpu, device_assert, thread_died, cuda_oom, ...) with facts.
    """
    report = await in_thread(api.triage_logs, list(paths or []), text=text, max_findings=max_findings)
    return api.answer(report, full=full)


def register(server: MCPServer) -> None:
    add_tool(server, triage_logs, title="Triage the logs of a failed job", annotations=READ_ONLY)
