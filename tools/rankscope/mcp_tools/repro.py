"""MCP tools ``list_repro_templates`` and ``generate_repro``: minimal repros, verified.

Thin adapters over ``rankscope.api``: argument checks the way an agent gets
them wrong, the blocking render/verify in a worker thread, the same models the
CLI prints with ``--json``.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer

from rankscope import api
from rankscope.errors import InvalidInput
from rankscope.mcp_tools._common import (
    LAST_ANSWERS,
    READ_ONLY,
    WRITES_FILES,
    Full,
    add_tool,
    arg,
    guard,
    in_thread,
    progress,
)
from rankscope.models.repro import RenderedRepro, TemplateList


@guard
async def list_repro_templates(full: Full = False) -> TemplateList:
    """List the minimal-repro templates: name, the symptom each shows (a hang verdict kind, a triage finding kind or a probe result), whether it needs CUDA, and its typed parameters with ranges and defaults.

    Next: generate_repro with name=... (or from_last_stacks=true to let rankscope pick).
    """
    listed = await in_thread(api.list_templates)
    hint = (
        "Render one with generate_repro(name=NAME, out='/tmp/repro.py'); fixed=true gives the corrected "
        "code, verify=true proves it."
    )
    return api.answer(listed, full=full).model_copy(update={"hint": hint})


@guard
async def generate_repro(
    name: Annotated[str | None, arg("A template name (list_repro_templates).")] = None,
    from_last_stacks: Annotated[
        bool, arg("Pick the template from this server's last dump_stacks answer.")
    ] = False,
    report: Annotated[
        dict[str, Any] | None,
        arg("A structured answer of dump_stacks, triage_logs or run_all_ranks, passed inline."),
    ] = None,
    from_report: Annotated[str | None, arg("The path of such a report saved as JSON.")] = None,
    params: Annotated[
        dict[str, str | int | float | bool] | None, arg("Template parameters; override what a report says.")
    ] = None,
    fixed: Annotated[bool, arg("Render the corrected code instead of the bug.")] = False,
    out: Annotated[str | None, arg("Write the script to this path (needed for verify).")] = None,
    overwrite: Annotated[bool, arg("Replace out when it exists (refused otherwise).")] = False,
    verify: Annotated[
        bool, arg("Run it and check that it shows the symptom (or, fixed, runs clean).")
    ] = False,
    nproc: Annotated[int | None, arg("Ranks for verify (default: the template's world size).")] = None,
    hang_timeout: Annotated[float, arg("Seconds of silence that count as a hang in verify.")] = 15.0,
    full: Full = False,
    ctx: Context[Any, Any] | None = None,
) -> RenderedRepro:
    """Generate a minimal repro script of a distributed failure, and optionally prove it reproduces.

    Give one source: name (a template), from_last_stacks=true (this server's last
    dump_stacks), report (a structured answer inline) or from_report (its file).
    From a report rankscope picks the template, fills world size, ops and shapes,
    and says why in reasons. verify answers verify.answer = reproduced / not
    reproduced (fixed: clean / not clean; skipped when it needs CUDA) with the
    evidence. The script runs as `torchrun --nproc_per_node=N repro.py`; hand it
    over with run_commands.
    """
    source = _source(name, from_last_stacks, report, from_report)
    api.check_repro_call(verify=verify, out=out, nproc=nproc, hang_timeout=hang_timeout)
    total = 2 if verify else 1
    await progress(ctx, 0, total, "rendering the repro")
    if source is not None:
        rendered = await in_thread(
            api.repro_from_report, source, out=out, fixed=fixed, params=params, overwrite=overwrite
        )
    else:
        rendered = await in_thread(
            api.render_repro, str(name), params, fixed=fixed, out=out, overwrite=overwrite
        )
    if verify and rendered.path:
        world = rendered.params.get("world_size")
        n = nproc or (world if isinstance(world, int) else 2)
        await progress(ctx, 1, total, f"running {rendered.path} on {n} ranks")
        result = await in_thread(api.verify_repro, rendered.path, nproc=n, hang_timeout=hang_timeout)
        rendered = rendered.model_copy(update={"verify": result})
    await progress(
        ctx, total, total, rendered.verify.answer if rendered.verify else f"rendered {rendered.template}"
    )
    return api.answer(rendered, full=full)


def _source(
    name: str | None, from_last_stacks: bool, report: dict[str, Any] | None, from_report: str | None
) -> Any:
    """The report to pick a template from (None: render ``name``); exactly one source is allowed."""
    given = [
        x
        for x, on in (
            ("name", name is not None),
            ("from_last_stacks", from_last_stacks),
            ("report", report is not None),
            ("from_report", from_report is not None),
        )
        if on
    ]
    if len(given) != 1:
        raise InvalidInput(
            f"pass exactly one of name, from_last_stacks, report and from_report (got {', '.join(given) or 'none'}).",
            fix="After dump_stacks pass from_last_stacks=true; or name a template from list_repro_templates.",
        )
    if from_last_stacks:
        last = LAST_ANSWERS.stacks
        if last is None:
            raise InvalidInput(
                "this server has not run dump_stacks yet, so there is no last answer to start from.",
                fix="Call dump_stacks first, or pass report=<its structured answer>.",
            )
        return last
    return report if report is not None else from_report


def register(server: MCPServer) -> None:
    add_tool(server, list_repro_templates, title="List minimal-repro templates", annotations=READ_ONLY)
    add_tool(server, generate_repro, title="Generate (and verify) a minimal repro", annotations=WRITES_FILES)
