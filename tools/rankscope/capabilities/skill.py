"""Read one section of the bundled skill: what every ``skill_section`` in an answer points at.

The playbooks are read from the installed files (never a copy), so a section served here
is the section SKILL.md links. An agent reads SKILL.md's decision table, then only the
section an answer names, instead of a whole playbook.
"""

from __future__ import annotations

from pathlib import Path

from rankscope.analysis.skill_sections import ROOT, Section, parse_ref, split_sections
from rankscope.errors import InvalidInput
from rankscope.models.skill import SkillSection
from rankscope.resources import playbooks_dir, skill_md


def playbook_files() -> dict[str, Path]:
    """Stem -> path of every playbook in skill/, sorted."""
    folder = playbooks_dir()
    if not folder.is_dir():
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.md")) if p.is_file()}


def all_sections() -> list[Section]:
    """Every section of every playbook, in file and then document order."""
    out: list[Section] = []
    for stem, path in playbook_files().items():
        out.extend(split_sections(stem, path.read_text(encoding="utf-8"))[1])
    return out


def read_skill(ref: str = "") -> SkillSection:
    """The section ``ref`` names (``hangs#progress-counters``, ``skill/hangs.md#...``), a whole
    playbook's introduction and its section list (``hangs``), SKILL.md (``SKILL``), or with no
    ``ref`` the index of every section."""
    if not ref.strip():
        return SkillSection(
            ref="", title="rankscope skill: every section", sections=[s.ref for s in all_sections()]
        )
    name, anchor = parse_ref(ref)
    if not name and anchor:
        return _any_playbook(anchor)
    if name == ROOT:
        return SkillSection(ref=ROOT, title="SKILL.md", text=skill_md().read_text(encoding="utf-8"))
    files = playbook_files()
    if name not in files:
        raise InvalidInput(
            f"no playbook {name!r} in the skill",
            fix=f"Name one of: {', '.join(files)} (e.g. `rankscope skill hangs`), or run `rankscope skill` for the index.",
        )
    intro, sections = split_sections(name, files[name].read_text(encoding="utf-8"))
    if not anchor:
        title = intro.splitlines()[0].lstrip("# ").strip() if intro.strip() else name
        return SkillSection(ref=name, title=title, text=intro, sections=[s.ref for s in sections])
    for s in sections:
        if s.anchor == anchor:
            return SkillSection(ref=s.ref, title=s.title, text=s.text)
    raise InvalidInput(
        f"no section #{anchor} in skill/{name}.md",
        fix=f"Its sections: {', '.join(s.anchor for s in sections)}; `rankscope skill {name}` lists them.",
    )


def _any_playbook(anchor: str) -> SkillSection:
    """``#oom``, SKILL.md's shorthand for a section of skill/tools.md: that section, else the one
    section of that name in any playbook."""
    found = sorted(
        (s for s in all_sections() if s.anchor == anchor), key=lambda s: s.ref.split("#")[0] != "tools"
    )
    if not found:
        raise InvalidInput(
            f"no section #{anchor} in any playbook of the skill",
            fix="Run `rankscope skill` for the index of every section, then pass one as PLAYBOOK#SECTION "
            "(e.g. `rankscope skill tools#oom`).",
        )
    return SkillSection(ref=found[0].ref, title=found[0].title, text=found[0].text)


__all__ = ["all_sections", "playbook_files", "read_skill"]
