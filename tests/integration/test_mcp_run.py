"""MCP `run_all_ranks` through an in-memory client: collapsed output, and the verdict when it hangs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from rankscope.mcp_server import build_server
from tests.jobs import PROGRAMS

SCRIPT = str(PROGRAMS / "run_ranks.py")


def _call(name: str, arguments: dict[str, Any]) -> tuple[Any, Any]:
    async def go() -> tuple[Any, Any]:
        async with Client(build_server()) as client:
            tools = await client.list_tools()
            result = await client.call_tool(name, arguments)
            return tools, result

    return anyio.run(go)


def test_bad_arguments_come_back_as_tool_errors_with_a_fix(tmp_path: Path) -> None:
    _, missing = _call("run_all_ranks", {"script": str(tmp_path / "nope.py")})
    assert missing.is_error
    assert "not a file" in missing.content[0].text and "Fix:" in missing.content[0].text
    _, zero = _call("run_all_ranks", {"script": SCRIPT, "nproc": 0})
    assert zero.is_error and "nproc" in zero.content[0].text


@pytest.mark.slow
def test_run_all_ranks_returns_collapsed_output() -> None:
    tools, result = _call("run_all_ranks", {"script": SCRIPT, "nproc": 2, "args": ["clean"], "timeout": 150})
    tool = next(t for t in tools.tools if t.name == "run_all_ranks")
    assert tool.annotations is not None and tool.annotations.read_only_hint is False
    assert tool.output_schema is not None and "collapsed_stdout" in tool.output_schema["properties"]
    assert not result.is_error, result.content
    report = result.structured_content
    assert report["outcome"] == "ok"
    lines = [(c["ranks"], c["text"], c["uniform"]) for c in report["collapsed_stdout"]]
    assert ([0, 1], "world size 2", True) in lines
    assert ([1], "local 2.0", False) in lines
    assert report["ranks"] == []  # bounded: raw per-rank output left out, and said so
    assert report["truncated"] is False  # nothing of the collapsed output was cut
    assert "raw per-rank output" in report["hint"]


@pytest.mark.slow
def test_run_all_ranks_returns_the_verdict_when_it_hangs() -> None:
    _, result = _call(
        "run_all_ranks", {"script": SCRIPT, "nproc": 2, "args": ["hang"], "timeout": 150, "hang_timeout": 4}
    )
    assert not result.is_error, result.content
    report = result.structured_content
    assert report["outcome"] == "hung"
    assert report["stacks"] is not None, report["notes"]
    verdict = report["stacks"]["verdict"]
    assert verdict["kind"] == "mismatched_collectives"
    assert 1 in verdict["suspect_ranks"]
    assert "Hung" in report["summary"]
