"""How every answer leaves rankscope: the one registry of answers, and the text block of an MCP answer.

:data:`ANSWERS` maps each answer type to its bound (what folds it within 8 KB) and its two text
views (a person's lines, an agent's text block). Both faces print through it: the façade exports
:func:`answer` (the answer bounded, unless the call asked for all of it), :func:`render_answer`
(a person's lines) and :func:`shape_answer` (the two forms an agent reads), and neither face
imports a bound or a renderer of its own.

Clients differ in what they hand the model (benchmarks/README.md#what-the-model-reads):
some pass only the text block, some only the structured content, a few both. The text
block is therefore a complete answer of its own, the verdict first, in the compact lines
the CLI prints (for stacks, a denser view written for a model), and never longer than
the budget: what does not fit is cut at a line boundary and said.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

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


@dataclass(frozen=True)
class AnswerKind:
    """How one answer type leaves rankscope: what folds it within the bound, and its two text views.

    Each is a function named by (module, name), imported only when that answer is given.

    Attributes:
        bound: folds what is secondary, so the answer fits the bound (None: the generic fit of
            :func:`shape_answer` alone); it takes the answer and the call's own keyword arguments
            (``full_ranks`` for stacks).
        human: the line renderer for a person (the CLI without --json); None: the compact JSON.
        brief: the text block an agent reads (the MCP text, the CLI's --brief); None: the
            compact JSON.
    """

    bound: tuple[str, str] | None
    human: tuple[str, str] | None
    brief: tuple[str, str] | None


_BOUND = "rankscope.analysis.sizing.bound"
_STACKS = "rankscope.render.stacks"
_TRIAGE = "rankscope.render.triage"
_REPRO = "rankscope.render.repro"
_MEMORY = "rankscope.render.memory"


def _same(module: str, name: str, bound: tuple[str, str] | None = None) -> AnswerKind:
    """An answer a person and an agent read in the same lines."""
    return AnswerKind(bound, (module, name), (module, name))


ANSWERS: dict[str, AnswerKind] = {
    "StacksReport": AnswerKind(
        (_BOUND, "bound_report"), (_STACKS, "render_stacks"), (_STACKS, "render_stacks_brief")
    ),
    "JobList": _same("rankscope.render.jobs", "render_jobs", (_BOUND, "brief_jobs")),
    "RunReport": _same("rankscope.render.run", "render_run"),
    "EnvReport": _same("rankscope.render.env", "render_env", (_BOUND, "bound_env")),
    "TriageReport": AnswerKind(
        (_BOUND, "bound_triage"), (_TRIAGE, "render_triage"), (_TRIAGE, "render_triage_brief")
    ),
    "ConsistencyReport": _same("rankscope.render.consistency", "render_consistency"),
    "PlacementsReport": _same("rankscope.render.placements", "render_placements"),
    "TemplateList": _same(_REPRO, "render_list", (_BOUND, "brief_templates")),
    "RenderedRepro": AnswerKind(None, (_REPRO, "render_repro_text"), (_REPRO, "render_repro_brief")),
    "VerifyResult": _same(_REPRO, "render_verify_lines"),
    "FlightReport": _same("rankscope.render.flight", "render_flight", (_BOUND, "bound_flight")),
    "MemoryReport": _same(_MEMORY, "render_memory"),
    "BudgetReport": _same(_MEMORY, "render_budget"),
    "SkillSection": _same("rankscope.render.skill", "render_skill"),
    "InstallReport": _same("rankscope.render.install", "render_install"),
    "WatchStarted": _same("rankscope.render.watch", "render_started"),
    "WatchList": _same("rankscope.render.watch", "render_watches"),
    "WatchView": _same("rankscope.render.watch", "render_watch"),
    "McpConfig": AnswerKind(None, ("rankscope.render.mcp_config", "render_mcp_config"), None),
}
"""The one registry of answers, by model type name: each answer's bound and renderers. Both faces
go through it (:func:`answer` to bound, :func:`render_answer` and :func:`shape_answer` to print),
so no face picks a bound or a renderer of its own (tests/unit/test_answer_registry.py)."""

M = TypeVar("M", bound=BaseModel)

_NONE = AnswerKind(None, None, None)


def _load(ref: tuple[str, str] | None) -> Callable[..., Any] | None:
    if ref is None:
        return None
    import importlib

    fn: Callable[..., Any] = getattr(importlib.import_module(ref[0]), ref[1])
    return fn


def answer(model: M, *, full: bool = False, **bound_args: Any) -> M:
    """``model`` as it leaves by default: folded by its answer type's bound (``bound_args`` are the
    call's own arguments the bound reads), or whole with ``full``. Both faces call it (the CLI for
    --json and --brief, the MCP tools always), never a bound of their own."""
    bound = None if full else _load(ANSWERS.get(type(model).__name__, _NONE).bound)
    return model if bound is None else cast(M, bound(model, **bound_args))


def render_answer(model: BaseModel) -> Iterator[str] | None:
    """``model`` in lines for a person (the CLI's text), or None when its answer type has none
    (the CLI prints the compact JSON)."""
    renderer = _load(ANSWERS.get(type(model).__name__, _NONE).human)
    return None if renderer is None else iter(renderer(model))


def _renderer(model: BaseModel) -> Callable[[Any], Iterator[str]] | None:
    """The text-block renderer for ``model``'s type, imported only when needed."""
    return _load(ANSWERS.get(type(model).__name__, _NONE).brief)


WHOLE_ANSWER: dict[str, str] = {
    "StacksReport": "last=true, full=true (CLI: rankscope stacks --last --full)",
}
"""How to ask for the whole answer where asking again would not give the same one: a stacks call
captures anew, so its hint names the last capture, kept for that (``last``)."""


def _whole(model: BaseModel) -> str:
    return WHOLE_ANSWER.get(type(model).__name__, "full=true")


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
            kept.append(f"[{len(lines) - i} more lines cut: pass {_whole(model)} for everything]")
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
    from rankscope.analysis.sizing.fit import fit
    from rankscope.models.compact import compact

    data: dict[str, Any] = compact(model)
    if full:
        return answer_text(model, max_bytes=1 << 30), data
    noted = len(data.get("left_out", []))
    fit(data, MAX_DATA_BYTES, f"pass {_whole(model)} for the whole answer")
    cut = len(data.get("left_out", [])) != noted  # fit names every cut it makes in left_out
    fitted = type(model).model_validate(data) if cut else model
    return answer_text(fitted), data
