"""`rankscope skill`: the section's Markdown as it is, then the sections it lists."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.models.skill import SkillSection


def render_skill(section: SkillSection) -> Iterator[str]:
    if section.text:
        yield from section.text.rstrip("\n").splitlines()
    if section.sections:
        yield "sections (rankscope skill <ref>; MCP resource rankscope://skill/<playbook>.md#<anchor>):"
        yield from (f"  {ref}" for ref in section.sections)
