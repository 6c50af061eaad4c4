"""Answer of `rankscope skill [REF]`: one section of the skill, or its index."""

from __future__ import annotations

from pydantic import Field

from rankscope.models.core import Model


class SkillSection(Model):
    """One playbook section (``hangs#progress-counters``), a playbook's introduction with its
    sections listed, SKILL.md itself, or (no reference) the index of every section."""

    ref: str = Field(
        description="What was read: 'hangs#progress-counters', 'hangs', 'SKILL' or '' (the index)."
    )
    title: str = ""
    text: str = Field(default="", description="The Markdown of the section, headings included.")
    sections: list[str] = Field(
        default_factory=list,
        description="For a playbook or the index: the sections to read next, as `rankscope skill` references.",
    )
    left_out: list[str] = Field(default_factory=list)
