"""Every section an answer names can be read alone, on the CLI and over MCP.

An answer's ``skill_section`` (``skill/hangs.md#progress-counters``) is where an agent
goes next; a name that resolves to nothing, or only to a whole 20 KB playbook, costs the
agent a step and the bytes. The code is read, not run: every string in rankscope's
source that spells a section, directly, through a module constant (``f"{_PLAYBOOK}#x"``)
or through a helper that builds it from one of its arguments (``_step(..., "x")``), and
every ``skill_section`` of the repro catalog, must resolve with ``read_skill``.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

from rankscope.analysis.sizing.fit import size_of
from rankscope.analysis.skill_sections import parse_ref, split_sections
from rankscope.capabilities.skill import all_sections, playbook_files, read_skill
from rankscope.errors import InvalidInput
from rankscope.render.answer import MAX_TEXT_BYTES
from rankscope.resources import bundle_root, skill_md
from tests.paths import ROOT

PKG = ROOT / "tools" / "rankscope"
REF = re.compile(r"^skill/[\w-]+\.md(#[\w-]+)?$")


def _constants(tree: ast.Module) -> dict[str, str]:
    """Every ``NAME = "text"`` of a module, at any depth (module constants and locals alike)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        out[target.id] = node.value.value
    return out


@functools.cache
def _constants_of(path: Path) -> dict[str, str]:
    """``_constants`` of one source file, parsed once however many modules import from it."""
    return _constants(_parse(path))


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _imported(tree: ast.Module) -> dict[str, str]:
    """String constants imported from other rankscope modules (``from ...frames import SKILL``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rankscope."):
            base = PKG.joinpath(*node.module.split(".")[1:])
            path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            if not path.is_file():
                continue
            there = _constants_of(path)
            for alias in node.names:
                if alias.name in there:
                    out[alias.asname or alias.name] = there[alias.name]
    return out


def _fill(node: ast.JoinedStr, names: dict[str, str]) -> str | None:
    parts: list[str] = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
            if value.value.id not in names:
                return None
            parts.append(names[value.value.id])
        else:
            return None
    return "".join(parts)


def _helpers(tree: ast.Module, names: dict[str, str]) -> dict[str, tuple[int, str, ast.JoinedStr]]:
    """Functions that build a section from an argument: name -> (position, parameter, the f-string)."""
    out: dict[str, tuple[int, str, ast.JoinedStr]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        params = [a.arg for a in fn.args.args]
        for node in ast.walk(fn):
            if isinstance(node, ast.JoinedStr):
                used = [
                    v.value.id
                    for v in node.values
                    if isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name)
                ]
                free = [u for u in used if u in params]
                probe = _fill(node, {**names, **{u: "x" for u in free}})
                if len(free) == 1 and probe is not None and REF.match(probe):
                    out[fn.name] = (params.index(free[0]), free[0], node)
    return out


@functools.cache
def sections_named_in_code() -> dict[str, frozenset[str]]:
    """Section reference -> the files that name it (scanned once per test process: the scan parses
    every module of the package, and two tests read it)."""
    found: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        tree = _parse(path)
        names = {**_imported(tree), **_constants_of(path)}
        helpers = _helpers(tree, names)
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            text: str | None = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = _fill(node, names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in helpers:
                pos, param, template = helpers[node.func.id]
                arg = node.args[pos] if len(node.args) > pos else None
                arg = arg or next((k.value for k in node.keywords if k.arg == param), None)
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    text = _fill(template, {**names, param: arg.value})
            if text is not None and REF.match(text):
                found.setdefault(text, set()).add(rel)
    catalog = json.loads((bundle_root() / "repro_templates" / "catalog.json").read_text(encoding="utf-8"))
    for match in re.findall(r'"skill_section":\s*"([^"]+)"', json.dumps(catalog)):
        found.setdefault(match, set()).add("repro_templates/catalog.json")
    return {ref: frozenset(where) for ref, where in found.items()}


def test_the_scan_sees_every_way_the_code_names_a_section() -> None:
    found = sections_named_in_code()
    assert (
        "skill/hangs.md#mismatched-collectives" in found
    )  # verdict_texts.py's _step(..., "mismatched-collectives")
    assert any(ref.startswith("skill/communication-errors.md#") for ref in found)  # log_rules f"{_CE}#..."
    assert "skill/multi-node.md#flight-recorder" in found  # a module constant
    assert any(ref.startswith("skill/wrong-results.md#") for ref in found)  # a local, pb
    assert "skill/oom.md#fragmentation" in found  # a constant imported from another module
    assert len(found) >= 45


def test_every_section_an_answer_names_resolves_to_that_section_alone() -> None:
    unresolved: list[str] = []
    for ref, where in sorted(sections_named_in_code().items()):
        try:
            answer = read_skill(ref)
        except InvalidInput:
            unresolved.append(f"{ref} (named in {', '.join(sorted(where))})")
            continue
        _, anchor = parse_ref(ref)
        if anchor:
            assert answer.text.startswith("#") and answer.ref.endswith(f"#{anchor}")
        else:
            assert answer.sections, f"{ref}: a playbook without sections"
    assert not unresolved, "sections named in the code but missing from the skill:\n" + "\n".join(unresolved)


def test_every_link_in_the_skill_resolves() -> None:
    texts = {"SKILL.md": skill_md().read_text(encoding="utf-8")}
    texts |= {f"skill/{p.name}": p.read_text(encoding="utf-8") for p in playbook_files().values()}
    bad: list[str] = []
    for where, text in texts.items():
        for target in re.findall(r"\]\(((?:skill/)?[a-z-]+\.md(?:#[a-z0-9-]+)?)\)", text):
            ref = target if target.startswith("skill/") else f"skill/{target}"
            try:
                read_skill(ref)
            except InvalidInput:
                bad.append(f"{where}: {target}")
    assert not bad, bad


def test_every_section_fits_one_answer() -> None:
    for section in all_sections():
        answer = read_skill(section.ref)
        assert size_of(answer.model_dump()) < MAX_TEXT_BYTES, f"{section.ref} is longer than one answer"


def test_the_ways_of_writing_a_reference() -> None:
    for ref in ("hangs#progress-counters", "hangs.md#progress-counters", "skill/hangs.md#progress-counters",
                "rankscope://skill/hangs.md#progress-counters"):  # fmt: skip
        assert parse_ref(ref) == ("hangs", "progress-counters")
    assert parse_ref("SKILL.md") == ("SKILL", "")
    assert read_skill("SKILL").text == skill_md().read_text(encoding="utf-8")
    index = read_skill("")
    assert "hangs#progress-counters" in index.sections and not index.text
    whole = read_skill("hangs")
    assert "hangs#nccl-hangs" in whole.sections and "## " not in whole.text
    with pytest.raises(InvalidInput, match="no section #nope"):
        read_skill("hangs#nope")
    with pytest.raises(InvalidInput, match="no playbook"):
        read_skill("nowhere#x")


def test_a_section_holds_its_subsections_and_code_is_not_a_heading() -> None:
    text = "# T\n\nintro\n\n## A\n\na\n\n```python\n# not a heading\n```\n\n### A1\n\nsub\n\n## B\n\nb\n"
    intro, sections = split_sections("p", text)
    assert intro == "# T\n\nintro\n"
    assert [(s.anchor, s.level) for s in sections] == [("a", 2), ("a1", 3), ("b", 2)]
    assert "# not a heading" in sections[0].text and "### A1" in sections[0].text
    assert "## B" not in sections[0].text and sections[1].text == "### A1\n\nsub\n"


def test_the_cli_prints_one_section(capsys: pytest.CaptureFixture[str]) -> None:
    from rankscope.cli import main

    assert main(["skill", "hangs#progress-counters"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Progress counters") and "## Mismatched collectives" not in out
    assert main(["skill", "skill/hangs.md#progress-counters", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ref"] == "hangs#progress-counters" and data["text"].startswith("## Progress counters")
    assert main(["skill", "hangs#nope"]) == 2


def test_every_section_is_an_mcp_resource() -> None:
    import anyio
    from mcp import Client

    from rankscope.mcp_server import build_server

    async def main() -> tuple[set[str], str, str]:
        async with Client(build_server()) as client:
            listed = {str(r.uri) for r in (await client.list_resources()).resources}
            one = await client.read_resource("rankscope://skill/hangs.md#progress-counters")
            sub = await client.read_resource("rankscope://skill/multi-node.md#real-answer")
            return listed, getattr(one.contents[0], "text", ""), getattr(sub.contents[0], "text", "")

    listed, one, sub = anyio.run(main)
    assert {f"rankscope://{s.link}" for s in all_sections()} <= listed
    assert one.startswith("## Progress counters") and "## Mismatched collectives" not in one
    assert sub.startswith("### Real answer")


def test_sections_come_from_the_installed_files() -> None:
    assert all(isinstance(p, Path) and p.is_file() for p in playbook_files().values())
