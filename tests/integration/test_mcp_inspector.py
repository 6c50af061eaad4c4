"""The MCP Inspector CLI (npm @modelcontextprotocol/inspector, pinned in tests/inspector)
as an independent client of `rankscope mcp`: another implementation of the protocol
must see the same tools, schemas, resources and prompts as the Python SDK does.

`.ci/setup` runs `npm install` in tests/inspector.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.paths import TESTS

INSPECTOR_DIR = TESTS / "inspector"
INSPECTOR = INSPECTOR_DIR / "node_modules" / ".bin" / "mcp-inspector"
RANKSCOPE = str(Path(sys.executable).parent / "rankscope")


@pytest.fixture(scope="module")
def inspector(tmp_path_factory: pytest.TempPathFactory) -> Any:
    assert INSPECTOR.exists(), (
        f"{INSPECTOR} is missing: run `.ci/setup` (or `npm install` in {INSPECTOR_DIR}) to install the pinned Inspector"
    )
    home = tmp_path_factory.mktemp("inspector-home")

    def run(*args: str, tool_error: bool = False) -> dict[str, Any]:
        env = {**os.environ, "HOME": str(home), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [str(INSPECTOR), "--cli", RANKSCOPE, "mcp", *args],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
            cwd=str(INSPECTOR_DIR),
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == (5 if tool_error else 0), (  # the Inspector exits 5 on an isError result
            f"inspector {args} failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}"
        )
        data: dict[str, Any] = json.loads(proc.stdout)
        return data

    return run


def test_inspector_tools_list(inspector: Any) -> None:
    tools = {t["name"]: t for t in inspector("--method", "tools/list")["tools"]}
    for name in ("list_jobs", "dump_stacks"):
        tool = tools[name]
        assert tool["annotations"]["readOnlyHint"] is True
        assert tool["annotations"]["destructiveHint"] is False
        assert tool["annotations"]["openWorldHint"] is False
        assert tool["outputSchema"]["type"] == "object"
    assert "verdict" in tools["dump_stacks"]["outputSchema"]["required"]
    assert "full_ranks" in tools["dump_stacks"]["inputSchema"]["properties"]
    for tool in tools.values():  # every parameter says what it takes
        assert all(p.get("description") for p in tool["inputSchema"].get("properties", {}).values()), tool[
            "name"
        ]
    assert tools["generate_repro"]["annotations"]["destructiveHint"] is True


def test_inspector_bad_argument_is_one_line_with_the_fix(inspector: Any) -> None:
    result = inspector(
        "--method",
        "tools/call",
        "--tool-name",
        "triage_logs",
        "--tool-arg",
        "max_findings=lots",
        tool_error=True,
    )
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert text.startswith("Invalid arguments for triage_logs: max_findings should be a valid integer (got")
    assert "\n" not in text and "Fix: max_findings:" in text


def test_inspector_tools_call(inspector: Any) -> None:
    result = inspector("--method", "tools/call", "--tool-name", "list_jobs")
    assert result["isError"] is False
    structured = result["structuredContent"]
    assert set(structured) == {"host", "jobs", "errors"}
    # the text block is the same answer written for a model, not the JSON a second time; other
    # jobs may run on this host while the suite runs, and then it lists them
    text = result["content"][0]["text"]
    if structured["jobs"]:
        assert text.startswith(structured["jobs"][0]["job_id"]) and not text.startswith("{"), text
    else:
        assert text == f"no distributed PyTorch jobs found on {structured['host']}"


def test_inspector_resource_read(inspector: Any) -> None:
    result = inspector("--method", "resources/read", "--uri", "rankscope://skill/hangs.md")
    (content,) = result["contents"]
    assert content["mimeType"] == "text/markdown"
    assert content["text"].startswith("# Hangs")


def test_inspector_prompt_get(inspector: Any) -> None:
    result = inspector(
        "--method", "prompts/get", "--prompt-name", "diagnose_hang", "--prompt-args", "pid=31337"
    )
    text = result["messages"][0]["content"]["text"]
    assert "dump_stacks on pid=31337" in text
