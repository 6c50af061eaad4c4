"""`rankscope mcp` as a real stdio subprocess, driven by the SDK's client.

The server is the installed console script, exactly what an MCP client starts. It
diagnoses a live hung gloo job; the "nothing found" and "permission denied" paths
run the same server in an empty PID namespace and as an unprivileged user.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent

from tests.jobs import JobFactory, RunningJob

T = TypeVar("T")

RANKSCOPE = str(Path(sys.executable).parent / "rankscope")
BASE_ENV = {
    "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
    "HOME": "/tmp",
    "OMP_NUM_THREADS": "1",
}


def over_stdio(command: list[str], fn: Callable[[Client], Awaitable[T]], timeout: float = 120) -> T:
    params = StdioServerParameters(command=command[0], args=command[1:], env=BASE_ENV, cwd="/")

    async def main() -> T:
        with anyio.fail_after(timeout):
            async with Client(params) as client:
                return await fn(client)

    return anyio.run(main)


def error_text(result: CallToolResult) -> str:
    assert result.is_error, f"expected an error, got {result.structured_content}"
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


@pytest.fixture(scope="module")
def hung(module_jobs: JobFactory) -> RunningJob:
    """One hung job for the module (rank 1 in barrier, rank 0 in all_reduce): the tests only read
    it, and the permission test needs no more than some job's launcher and rank pids."""
    job = module_jobs.torchrun("mcp_hang.py", nproc=2, args=["--mode", "mismatch"])
    job.wait_ready(["rank0", "rank1"])
    return job


@pytest.mark.slow
def test_stdio_server_diagnoses_a_live_hang(hung: RunningJob, pyspy_works: str) -> None:
    async def session(c: Client) -> tuple[list[str], dict[str, Any]]:
        names = [t.name for t in (await c.list_tools()).tools]
        report: dict[str, Any] = {}
        # rank 0 marks itself ready just before all_reduce: poll until both ranks are inside
        with anyio.fail_after(60):
            while report.get("verdict", {}).get("kind") != "mismatched_collectives":
                res = await c.call_tool("dump_stacks", {"pid": hung.pid})
                assert not res.is_error, res.content
                report = res.structured_content or {}
        return names, report

    names, report = over_stdio([RANKSCOPE, "mcp"], session)
    assert {"list_jobs", "dump_stacks"} <= set(names)
    verdict = report["verdict"]
    assert verdict["kind"] == "mismatched_collectives"
    assert verdict["suspect_ranks"] == [0, 1]  # an even split: no majority to name one culprit
    groups = {g["op"]: g["ranks"] for g in report["groups"]}
    assert groups == {"all_reduce": [0], "barrier": [1]}
    assert any(s["skill_section"] == "skill/hangs.md#mismatched-collectives" for s in verdict["next_steps"])
    assert report["job"]["launcher_pid"] == hung.pid


def test_stdio_nothing_found_in_an_empty_pid_namespace() -> None:
    unshare = shutil.which("unshare")
    assert unshare, "util-linux unshare is needed for this test"
    command = [unshare, "--pid", "--fork", "--mount-proc", "--kill-child", RANKSCOPE, "mcp"]

    async def session(c: Client) -> tuple[dict[str, Any], CallToolResult]:
        listed = await c.call_tool("list_jobs", {})
        assert not listed.is_error, listed.content
        return listed.structured_content or {}, await c.call_tool("dump_stacks", {})

    listed, dumped = over_stdio(command, session)
    assert listed["jobs"] == []
    text = error_text(dumped)
    assert "No distributed PyTorch job found on this host." in text
    # the fix leads with the srun call where Slurm's clients are installed (a login node)
    assert "Fix: " in text and "Check the host and the user first" in text


@pytest.mark.slow
def test_stdio_permission_denied_for_another_users_job(hung: RunningJob) -> None:
    setpriv = shutil.which("setpriv")
    assert setpriv, "util-linux setpriv is needed for this test"
    rank_pid = hung.rank_pids()[0]
    command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", RANKSCOPE, "mcp"]

    async def session(c: Client) -> tuple[CallToolResult, CallToolResult]:
        return await c.call_tool("list_jobs", {"pid": rank_pid}), await c.call_tool(
            "dump_stacks", {"pid": hung.pid}
        )

    listed, dumped = over_stdio(command, session)
    for result in (listed, dumped):
        text = error_text(result)
        assert "permission denied" in text
        assert "Fix: Run rankscope as the job's user or as root" in text
        assert "CAP_SYS_PTRACE" in text
