"""Lines for a person: the text view of `rankscope repro` (typed on its model; pure)."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.models.repro import RenderedRepro, TemplateList, VerifyResult
from rankscope.render.next_steps import render_next_steps


def render_list(report: TemplateList) -> Iterator[str]:
    width = max((len(t.name) for t in report.templates), default=10)
    for t in report.templates:
        cuda = "  [needs CUDA]" if t.requires_cuda else ""
        yield f"{t.name:<{width}}  {t.symptom_source}:{t.symptom:<24} {t.title}{cuda}"
    yield ""
    yield report.hint


def render_verify_lines(v: VerifyResult) -> Iterator[str]:
    yield f"verify: {v.answer.upper()} ({'as expected' if v.ok else 'NOT as expected'})"
    yield f"  {v.summary}"
    for line in v.evidence:
        yield f"  - {line}"
    yield from render_next_steps(v.next_steps, indent="  ")


def render_repro_text(r: RenderedRepro) -> Iterator[str]:
    fixed = " (fixed)" if r.fixed else ""
    yield f"{r.template}{fixed}: {r.title}; symptom {r.symptom_source}:{r.symptom}" + (
        "; needs CUDA" if r.requires_cuda else ""
    )
    for reason in r.reasons:
        yield f"  why: {reason}"
    yield "  params: " + ", ".join(f"{k}={v!r}" for k, v in r.params.items())
    if r.path:
        yield f"  wrote {r.path}"
        for cmd in r.run_commands:
            yield f"  run: {cmd}"
    yield f"  playbook: {r.skill_section}"
    if r.verify is not None:
        yield from render_verify_lines(r.verify)


def render_repro_brief(r: RenderedRepro) -> Iterator[str]:
    """The text block an agent reads: the person's lines (the verify lines among them), and the
    script itself when it was not written to a file (the agent has nowhere else to read it)."""
    yield from render_repro_text(r)
    if r.path is None and r.script:
        yield "script:"
        yield r.script
