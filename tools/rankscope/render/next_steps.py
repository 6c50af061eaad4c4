"""The one way a report's next steps are printed for a person, whatever the report."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from rankscope.models.core import NextStep


def render_next_steps(steps: Sequence[NextStep], *, indent: str = "") -> Iterator[str]:
    """A numbered "next steps:" block: each action, then the tool to call and the playbook section.

    The tool is named the way both faces know it (the MCP tool name; the CLI help maps it to its
    command), so a person and an agent read the same step.
    """
    if not steps:
        return
    yield f"{indent}next steps:"
    for i, step in enumerate(steps, 1):
        refs = ", ".join(
            x for x in (f"tool: {tool_call(step)}" if step.tool else "", step.skill_section or "") if x
        )
        yield f"{indent}  {i}. {step.action}" + (f" [{refs}]" if refs else "")


def brief_next_steps(steps: Sequence[NextStep]) -> Iterator[str]:
    """``next 1: action -> tool(args) [section]``: the steps as a model reads them, one line each,
    in the brief views of every answer. A section is named once: a step that points into the same
    one as the step before it does not name it again."""
    previous: str | None = None
    for i, step in enumerate(steps, 1):
        call = f" -> {tool_call(step)}" if step.tool else ""
        section = step.skill_section if step.skill_section != previous else None
        previous = step.skill_section
        yield f"next {i}: {step.action}{call}" + (f" [{section}]" if section else "")


def tool_call(step: NextStep) -> str:
    """``generate_repro(from_last_stacks=true)``: the call to make, arguments in JSON; the bare
    tool name when the step has none."""
    if not step.args:
        return step.tool or ""
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in step.args.items())
    return f"{step.tool}({args})"
