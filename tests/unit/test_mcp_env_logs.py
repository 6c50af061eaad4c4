"""MCP `collect_env` and `triage_logs` through an in-memory client: structured output, errors with a fix."""

from __future__ import annotations

from typing import Any

import anyio
from mcp import Client

from rankscope.mcp_server import build_server
from tests.paths import DATA as DATA_ROOT

LOGS = DATA_ROOT / "logs"


def _call(calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, list[Any]]:
    async def go() -> tuple[Any, list[Any]]:
        async with Client(build_server()) as client:
            tools = await client.list_tools()
            return tools, [await client.call_tool(name, args) for name, args in calls]

    return anyio.run(go)


def test_triage_logs_and_collect_env_over_mcp() -> None:
    tools, (triage, pasted, missing, env, bad_pid) = _call(
        [
            ("triage_logs", {"paths": [str(LOGS / "nccl_watchdog_lagging_rank.log")]}),
            ("triage_logs", {"text": (LOGS / "cuda_oom.log").read_text()}),
            ("triage_logs", {"paths": [str(LOGS / "nope.log")]}),
            ("collect_env", {"include_torch": False}),
            ("collect_env", {"pid": 999999999, "include_torch": False}),
        ]
    )
    by_name = {t.name: t for t in tools.tools}
    for name, field in (("triage_logs", "suspect_ranks"), ("collect_env", "findings")):
        tool = by_name[name]
        assert tool.annotations is not None and tool.annotations.read_only_hint is True
        assert tool.output_schema is not None and field in tool.output_schema["properties"]

    assert not triage.is_error, triage.content
    assert triage.structured_content["suspect_ranks"] == [2]
    assert triage.structured_content["kinds"]["collective_timeout"] == 4
    assert pasted.structured_content["findings"][0]["kind"] == "cuda_oom"
    assert (
        missing.is_error and "no such file" in missing.content[0].text and "Fix:" in missing.content[0].text
    )

    assert not env.is_error, env.content
    node = env.structured_content["node"]
    assert "no NVIDIA driver" in node["gpu_note"] and node.get("torch") is None
    assert bad_pid.is_error and "Fix:" in bad_pid.content[0].text


def test_triage_logs_over_mcp_reads_a_dead_jobs_folder_in_one_call() -> None:
    _, (res,) = _call([("triage_logs", {"paths": [str(DATA_ROOT / "postmortem" / "gpu_stuck")]})])
    assert not res.is_error, res.content
    data = res.structured_content
    assert data["suspect_ranks"] == [0] and data["decided_by"] == "flight_recorder"
    assert data["playbook"] == data["next_steps"][0]["skill_section"] == "skill/hangs.md#nccl-hangs"
    assert data["flight"]["kind"] == "divergent_ranks" and data["stacks"]["kind"]
    text = res.content[0].text
    assert "decided by: flight recorder" in text.splitlines()[1] and len(text.encode()) <= 8192
