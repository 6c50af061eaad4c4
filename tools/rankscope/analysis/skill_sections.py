"""The skill's playbooks cut into sections an agent can read one at a time.

An agent that follows a ``skill_section`` such as ``skill/hangs.md#progress-counters``
needs that section, not the whole playbook: a playbook is 9-24 KB, a section well
under the answer budget. Every heading of level 2 or 3 is a section; its text runs to
the next heading of the same or a higher level, so a ``##`` section holds its ``###``
subsections. Anchors are GitHub's (what the Markdown links in SKILL.md use).

Pure: Markdown text in, sections out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
ROOT = "SKILL"
"""The reference of SKILL.md itself (``rankscope skill SKILL``)."""


@dataclass(frozen=True)
class Section:
    """One section of a playbook: ``playbook`` is the file's stem (``hangs``)."""

    playbook: str
    anchor: str
    title: str
    level: int
    text: str

    @property
    def ref(self) -> str:
        """``hangs#progress-counters``: how the CLI names it."""
        return f"{self.playbook}#{self.anchor}"

    @property
    def link(self) -> str:
        """``skill/hangs.md#progress-counters``: how answers and SKILL.md name it."""
        return f"skill/{self.playbook}.md#{self.anchor}"


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index, level, title) of every heading outside fenced code blocks."""
    out: list[tuple[int, int, str]] = []
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            out.append((i, len(m.group(1)), m.group(2)))
    return out


def split_sections(playbook: str, markdown: str) -> tuple[str, list[Section]]:
    """The playbook's introduction (its text before the first section) and its sections, in order."""
    lines = markdown.splitlines()
    heads = _headings(lines)
    found = [(i, level, title) for i, level, title in heads if level in (2, 3)]
    intro_end = found[0][0] if found else len(lines)
    sections: list[Section] = []
    for i, level, title in found:
        end = next((j for j, lv, _ in heads if j > i and lv <= level), len(lines))
        text = "\n".join(lines[i:end]).strip() + "\n"
        sections.append(Section(playbook, slug(title), title, level, text))
    return "\n".join(lines[:intro_end]).strip() + "\n", sections


def parse_ref(ref: str) -> tuple[str, str]:
    """(playbook stem, anchor) of any way a section is written; anchor ``""`` for a whole playbook.

    ``hangs#progress-counters``, ``hangs.md#progress-counters``, ``skill/hangs.md#...``,
    ``rankscope://skill/hangs.md#...`` and ``SKILL.md`` all work: an agent pastes what it read.
    """
    text = ref.strip()
    for prefix in ("rankscope://", "skill/"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    name, _, anchor = text.partition("#")
    name = name.strip().rstrip("/")
    if name.endswith(".md"):
        name = name[: -len(".md")]
    if name.upper() == ROOT:
        name = ROOT
    return name, anchor.strip().lower()


__all__ = ["ROOT", "Section", "parse_ref", "slug", "split_sections"]
