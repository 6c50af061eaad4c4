"""MCP tools ``list_repro_templates`` and ``generate_repro``: minimal repros, verified.

Thin adapters over ``rankscope.api``: argument checks the way an agent gets
them wrong, the blocking render/verify in a worker thread, the same models the
CLI prints with ``--json``.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from rankscope import api
from rankscope.errors import InvalidInput
from rankscope.mcp_tools._common import READ_ONLY, STARTS_PROCESSES, add_tool, guard, in_thread, progress
from rankscope.models.repro import RenderedRepro, TemplateList


@guard
async def list_repro_templates() -> TemplateList:
    """List the minimal-repro templates: name, the symptom each shows (a hang verdict kind, a triage finding kind or a probe result), whether it needs CUDA, and its typed parameters with ranges and defaults.

    Next: generate_repro with name=... (or from_report=... to let rankscope pick).
    """
    return await in_thread(api.list_templates)


@guard
async def generate_repro(
    name: str | None = None,
    params: dict[str, str | int | float | bool] | None = None,
    from_report: str | None = None,
    fixed: bool = False,
    out: str | None = None,
    verify: bool = False,
    nproc: int | None = None,
    hang_timeout: float = 15.0,
    ctx: Context[Any, Any] | None = None,
) -> RenderedRepro:
    """Generate a minimal repro script of a distributed failure, and optionally prove it reproduces.

    Either name a template (list_repro_templates; params overrides its
    defaults, validated and bounded) or pass from_report (params then
    overrides what was read from the report): the path of a JSON
    report from dump_stacks / `rankscope stacks --json`, triage_logs /
    `rankscope triage --json` or `rankscope run --json`; rankscope then picks
    the template and fills world size, ops and shapes from it, and says why in
    reasons. fixed=True renders the corrected code. out: where to write the
    script (needed for verify). verify=True runs it under rankscope run with a
    hang timeout and answers verify.answer = reproduced / not reproduced (or,
    fixed, clean / not clean; skipped when it needs CUDA) with the evidence.
    The script runs as `torchrun --nproc_per_node=N repro.py` or
    `python repro.py`; hand it over with run_commands.
    """
    if (name is None) == (from_report is None):
        raise InvalidInput(
            "pass exactly one of name and from_report.",
            fix="Call list_repro_templates for the names, or pass from_report='/path/report.json' from dump_stacks or triage_logs.",
        )
    if verify and not out:
        raise InvalidInput(
            "verify needs out: the script must be written to disk to run.", fix="Pass out='/tmp/repro.py'."
        )
    if hang_timeout <= 0 or (nproc is not None and nproc < 1):
        raise InvalidInput(
            f"hang_timeout and nproc must be positive, got {hang_timeout} and {nproc}.",
            fix="E.g. hang_timeout=15, nproc=2.",
        )
    total = 2 if verify else 1
    await progress(ctx, 0, total, "rendering the repro")
    if from_report is not None:
        rendered = await in_thread(api.repro_from_report, from_report, out=out, fixed=fixed, params=params)
    else:
        rendered = await in_thread(api.render_repro, str(name), params, fixed=fixed, out=out)
    if verify and rendered.path:
        world = rendered.params.get("world_size")
        n = nproc or (world if isinstance(world, int) else 2)
        await progress(ctx, 1, total, f"running {rendered.path} on {n} ranks")
        result = await in_thread(api.verify_repro, rendered.path, nproc=n, hang_timeout=hang_timeout)
        rendered = rendered.model_copy(update={"verify": result})
    await progress(
        ctx, total, total, rendered.verify.answer if rendered.verify else f"rendered {rendered.template}"
    )
    return rendered


def register(server: MCPServer) -> None:
    add_tool(server, list_repro_templates, title="List minimal-repro templates", annotations=READ_ONLY)
    add_tool(
        server, generate_repro, title="Generate (and verify) a minimal repro", annotations=STARTS_PROCESSES
    )
