"""The text block of an MCP answer: the model's reading of each report, bounded.

Clients differ in what they hand the model (benchmarks/README.md#what-the-model-reads):
some pass only the text block, some only the structured content, a few both. The text
block is therefore a complete answer of its own, the verdict first, in the compact lines
the CLI prints (for stacks, a denser view written for a model), and never longer than
the budget: what does not fit is cut at a line boundary and said.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel

MAX_TEXT_BYTES = 8_000

ANSWER_BOUND = (
    "Every answer is at most 8 KB in every form (the MCP text and structured content, the CLI's "
    "--brief and --json); left_out names what was cut and how to get it back; full=true (CLI --full) "
    "gives the whole answer."
)
"""The one statement of how answers are bounded: SKILL.md, the playbooks, ``--help`` and the MCP
descriptions say exactly this (tests/unit/test_answer_contract.py), and MAX_TEXT_BYTES and
MAX_DATA_BYTES are what makes it true."""


def _renderer(model: BaseModel) -> Callable[[Any], Iterator[str]] | None:
    """The line renderer for ``model``'s type, imported only when needed."""
    name = type(model).__name__
    if name == "StacksReport":
        from rankscope.render.stacks import render_stacks_brief

        return render_stacks_brief
    if name == "RenderedRepro":
        return _repro_lines
    table: dict[str, tuple[str, str]] = {
        "JobList": ("jobs", "render_jobs"),
        "RunReport": ("run", "render_run"),
        "EnvReport": ("env", "render_env"),
        "TriageReport": ("triage", "render_triage_brief"),
        "ConsistencyReport": ("consistency", "render_consistency"),
        "PlacementsReport": ("placements", "render_placements"),
        "TemplateList": ("repro", "render_list"),
        "FlightReport": ("flight", "render_flight"),
        "MemoryReport": ("memory", "render_memory"),
        "BudgetReport": ("memory", "render_budget"),
        "SkillSection": ("skill", "render_skill"),
    }
    where = table.get(name)
    if where is None:
        return None
    import importlib

    module = importlib.import_module(f"rankscope.render.{where[0]}")
    fn: Callable[[Any], Iterator[str]] = getattr(module, where[1])
    return fn


def _repro_lines(report: Any) -> Iterator[str]:
    from rankscope.render.repro import render_repro_text, render_verify_lines

    yield from render_repro_text(report)
    if report.verify is not None:
        yield from render_verify_lines(report.verify)
    if report.path is None and report.script:
        yield "script:"
        yield report.script


def answer_text(model: BaseModel, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """``model`` as the text a model reads: its renderer's lines, cut to ``max_bytes``.

    A report with no renderer is given as its compact JSON (never the indented dump).
    """
    renderer = _renderer(model)
    if renderer is None:
        import json

        from rankscope.models.compact import compact

        return json.dumps(compact(model), separators=(",", ":"))[:max_bytes]
    lines = _collapse_blank(renderer(model))
    left_out = [f"left out: {x}" for x in getattr(model, "left_out", [])]
    kept: list[str] = []
    used = sum(len(x.encode()) + 1 for x in left_out)
    for i, line in enumerate(lines):
        cost = len(line.encode()) + 1
        if used + cost > max_bytes - 120:
            kept.append(f"[{len(lines) - i} more lines cut: pass full=true for everything]")
            break
        kept.append(line)
        used += cost
    return "\n".join([*kept, *left_out])


def _collapse_blank(lines: Iterator[str]) -> list[str]:
    """The renderer's lines without blank runs (they cost bytes and say nothing to a model)."""
    return [line for line in lines if line.strip()]


MAX_DATA_BYTES = 8_000


def shape_answer(model: BaseModel, *, full: bool = False) -> tuple[str, dict[str, Any]]:
    """The two forms of one MCP answer: (text block, structured content).

    The structured content is the model's compact JSON, fitted to the budget unless ``full``;
    what was cut is listed in its ``left_out`` and repeated at the end of the text. Both stay
    valid readings of the same model, so a client that passes either one loses nothing.
    """
    from rankscope.analysis.fit import fit
    from rankscope.models.compact import compact

    data: dict[str, Any] = compact(model)
    if full:
        return answer_text(model, max_bytes=1 << 30), data
    noted = len(data.get("left_out", []))
    fit(data, MAX_DATA_BYTES, "pass full=true for the whole answer")
    cut = len(data.get("left_out", [])) != noted  # fit names every cut it makes in left_out
    fitted = type(model).model_validate(data) if cut else model
    return answer_text(fitted), data
