"""SKILL.md against the Agent Skills spec, and against what rankscope really serves.

Spec rules checked (agentskills.io specification): frontmatter keys limited to name,
description, license, compatibility, metadata, allowed-tools; name 1-64 chars of
lowercase letters, digits and single hyphens, not starting or ending with one, equal
to the skill folder's name; description 1-1024 chars; compatibility at most 500;
metadata a string-to-string map. The body stays under 500 lines. Every tool, CLI
command and playbook SKILL.md names must exist.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import anyio
import pytest
from mcp import Client

from rankscope.analysis.hang.verdict_texts import PLAYBOOK, STEPS
from rankscope.capabilities.install import install_skill
from rankscope.mcp_server import build_server
from rankscope.models.core import VerdictKind
from rankscope.resources import bundle_root, playbooks_dir, skill_md

ALLOWED_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def parse_skill(text: str) -> tuple[dict[str, object], str]:
    """Split SKILL.md into frontmatter and body.

    The frontmatter is kept to the YAML subset harnesses agree on: ``key: value`` on one
    line (plain scalars), and one nested level of ``key: value`` under ``metadata``.
    """
    lines = text.splitlines()
    assert lines[0] == "---", "SKILL.md must start with a '---' frontmatter line"
    end = lines.index("---", 1)
    front: dict[str, object] = {}
    current: dict[str, str] | None = None
    for line in lines[1:end]:
        if line.startswith("  "):
            assert current is not None, f"indented line outside a mapping: {line!r}"
            key, sep, value = line.strip().partition(": ")
            assert sep, f"not a key: value line: {line!r}"
            current[key] = value.strip().strip('"')
            continue
        key, _, value = line.partition(":")
        value = value.strip()
        if value:
            assert ": " not in value and " #" not in value, (
                f"{key}: a plain YAML scalar cannot hold ': ' or ' #'"
            )
            assert not value.startswith(("'", '"', "[", "{", "|", ">", "&", "*", "!")), (
                f"{key}: keep it a plain scalar"
            )
            front[key] = value
            current = None
        else:
            current = {}
            front[key] = current
    return front, "\n".join(lines[end + 1 :])


def anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the headings in a Markdown text."""
    out: set[str] = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


@pytest.fixture(scope="module")
def skill() -> tuple[dict[str, object], str]:
    return parse_skill(skill_md().read_text(encoding="utf-8"))


def test_frontmatter_follows_the_spec(skill: tuple[dict[str, object], str]) -> None:
    front, _ = skill
    assert set(front) <= ALLOWED_KEYS, f"keys outside the spec: {set(front) - ALLOWED_KEYS}"
    name = front["name"]
    assert isinstance(name, str) and 1 <= len(name) <= 64 and NAME_RE.match(name)
    assert name == "rankscope"
    description = front["description"]
    assert isinstance(description, str) and 1 <= len(description) <= 1024
    for trigger in (
        "hang",
        "deadlock",
        "NCCL",
        "Gloo",
        "timeout",
        "watchdog",
        "rank",
        "OOM",
        "FSDP",
        "DTensor",
    ):
        assert trigger in description, f"description does not name the trigger {trigger!r}"
    compatibility = front.get("compatibility")
    assert compatibility is None or (isinstance(compatibility, str) and 1 <= len(compatibility) <= 500)
    metadata = front.get("metadata", {})
    assert isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())


SKILL_BUDGET = 3_072
"""SKILL.md is read whole before anything else: it holds the decision table and little more."""


def test_body_is_a_short_decision_procedure(skill: tuple[dict[str, object], str]) -> None:
    _, body = skill
    assert len(skill_md().read_bytes()) <= SKILL_BUDGET, (
        "SKILL.md grew: move the detail into a playbook section"
    )
    assert "## Decide" in body and "| symptom | first call" in body
    tools = (playbooks_dir() / "tools.md").read_text(encoding="utf-8")
    kinds = tools.split("### Verdict kinds", 1)[1].split("\n## ", 1)[0]
    for kind in get_args(VerdictKind):  # one section away, linked from SKILL.md
        assert f"- `{kind}`: " in kinds, f"skill/tools.md does not explain the verdict kind {kind}"
    assert "(skill/tools.md#tools)" in body and "`--brief`" in body
    # hung or slow: dump_stacks first decides whether the job moves
    row = next(line for line in body.splitlines() if line.startswith("| the job looks hung"))
    assert "`dump_stacks`" in row and "`rankscope stacks --brief`" in row
    for kind in ("progressing", "straggler", "busy"):  # hung or slow: said before any hang verdict
        assert f"`{kind}`" in body
    tools_anchors = anchors(tools)
    for anchor in re.findall(r"(?:tools)?#([a-z0-9-]+)`", body):  # `rankscope skill tools#oom` and its kin
        if anchor != "nccl-hangs":
            assert anchor in tools_anchors, anchor
    dead = next(line for line in body.splitlines() if line.startswith("| the job is dead"))
    assert "`triage_logs(" in dead and "one call" in dead
    assert "rankscope skill hangs#" in body and "rankscope://skill/hangs.md#" in body
    for field in ("Symptom", "Evidence", "Root cause", "Fix", "Repro"):
        assert field in body


def test_what_left_skill_md_lives_in_a_playbook() -> None:
    tools = (playbooks_dir() / "tools.md").read_text(encoding="utf-8")
    for heading in ("## Tools", "## Answers", "## Crash or killed worker", "## Communication error",
                    "## Wrong results", "## OOM", "## Sharding question", "## When to generate a minimal repro",
                    "## Incident summary"):  # fmt: skip
        assert heading in tools
    for field in ("Symptom:", "Evidence:", "Root cause:", "Fix:", "Repro:"):
        assert field in tools
    # the cargo cult is named and corrected, not recommended
    assert "extra traversal of the autograd" in tools
    assert "`torch.cuda.empty_cache()` is not an OOM cure" in tools
    hangs = (playbooks_dir() / "hangs.md").read_text(encoding="utf-8")
    assert "`CUDA_LAUNCH_BLOCKING=1` for a hang" in hangs
    assert "## Hung or slow" in hangs and "`window_s`" in hangs


def test_skill_name_equals_the_installed_folder(tmp_path: Path, skill: tuple[dict[str, object], str]) -> None:
    front, _ = skill
    report = install_skill(dir=str(tmp_path / "skills" / "rankscope"))
    assert Path(report.directory).name == front["name"] == report.skill_name
    assert not [n for n in report.notes if "folder" in n]
    other = install_skill(dir=str(tmp_path / "elsewhere"))
    assert any("expect them to match" in n for n in other.notes)


def test_every_tool_named_is_served_by_the_live_server(skill: tuple[dict[str, object], str]) -> None:
    _, body = skill
    tools_md = (playbooks_dir() / "tools.md").read_text(encoding="utf-8")
    table = re.findall(r"^\| `([a-z_]+)` \| `rankscope ([a-z-]+)` \|", tools_md, flags=re.MULTILINE)
    named_tools = {tool for tool, _ in table}
    assert {
        "list_jobs",
        "dump_stacks",
        "generate_repro",
        "analyze_flight_recorder",
        "inspect_memory",
    } <= named_tools

    async def served(c: Client) -> set[str]:
        return {t.name for t in (await c.list_tools()).tools}

    async def main() -> set[str]:
        async with Client(build_server()) as client:
            return await served(client)

    live = anyio.run(main)
    # every backticked snake_case word that looks like a tool call must be a served tool
    mentioned = {
        w
        for w in re.findall(r"`([a-z]+(?:_[a-z]+)+)(?:\(|`)", body)
        if w in named_tools or w.endswith("_jobs")
    }
    missing = sorted((named_tools | mentioned) - live)
    assert not missing, f"SKILL.md names tools the server does not serve: {missing}"


def test_every_cli_command_named_exists(skill: tuple[dict[str, object], str]) -> None:
    from rankscope.cli import build_parser

    _, body = skill
    _, table = build_parser()
    tools_md = (playbooks_dir() / "tools.md").read_text(encoding="utf-8")
    commands = set(re.findall(r"`rankscope ([a-z][a-z-]*)", body + tools_md))
    missing = sorted(commands - set(table))
    assert not missing, f"SKILL.md names CLI commands that do not exist: {missing}"


def test_every_playbook_linked_exists(skill: tuple[dict[str, object], str]) -> None:
    _, body = skill
    links = set(re.findall(r"\]\((skill/[a-z-]+\.md)(?:#([a-z0-9-]+))?\)", body))
    files = {path for path, _ in links}
    assert {"skill/hangs.md", "skill/crashes.md", "skill/wrong-results.md", "skill/oom.md"} <= files
    missing = sorted(p for p in files if not (bundle_root() / p).is_file())
    assert not missing, f"SKILL.md links playbooks that do not exist: {missing}"
    for path, anchor in links:
        if anchor:
            assert anchor in anchors((bundle_root() / path).read_text(encoding="utf-8")), f"{path}#{anchor}"


def test_hangs_playbook_has_a_section_for_every_verdict_and_step() -> None:
    hangs = (playbooks_dir() / "hangs.md").read_text(encoding="utf-8")
    have = anchors(hangs)
    for kind in get_args(VerdictKind):
        assert kind.replace("_", "-") in have, f"skill/hangs.md has no #{kind.replace('_', '-')} section"
    # every skill_section the hang analysis emits resolves to a heading
    refs = {tuple(text.skill_section.split("#", 1)) for text in STEPS.values()}
    assert {playbook for playbook, _ in refs} == {PLAYBOOK} == {"skill/hangs.md"}
    emitted = {section for _, section in refs}
    assert "mismatched-collectives" in emitted
    assert emitted <= have, f"sections emitted by the analysis but missing from hangs.md: {emitted - have}"
    assert "```json" in hangs  # real tool output is shown
