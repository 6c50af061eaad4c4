"""A job that never started, on one host: WORLD_SIZE=4 and only ranks 0 and 1 started.

Both ranks wait in ``init_process_group`` for ranks that never come. ``ps`` lists the job as
starting, and ``stacks`` (the CLI and the MCP tool alike) names the ranks that never started and
the setting that decides it, at the confidence one host allows (they could run elsewhere).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
from mcp import Client

from rankscope.mcp_server import build_server
from tests.jobs import PROGRAMS, JobFactory, free_port, run_cli

PROGRAM = PROGRAMS / "startup_wait.py"


def test_world_size_larger_than_the_ranks_started(jobs: JobFactory, tmp_path: Path) -> None:
    port = free_port()
    ranks = [
        jobs.start(
            [sys.executable, str(PROGRAM)], nproc=1, port=port, cwd=tmp_path, tag=f"rank{rank}",
            env={"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "4"},
        )
        for rank in (0, 1)
    ]  # fmt: skip
    for rank in ranks:
        rank.wait_ready(1)
    pid = str(ranks[0].pid)

    ps = run_cli("ps", "--pid", pid, "--json")
    assert ps.returncode == 0, ps.stderr
    [job] = json.loads(ps.stdout)["jobs"]
    assert any(n.startswith("starting: init: rank") for n in job["notes"]), job["notes"]

    res = run_cli("stacks", "--pid", pid, "--brief")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("verdict: startup, confidence medium; suspects: ranks 2-3\n"), res.stdout
    summary = "starting: init: ranks 0-1 wait in init_process_group for ranks 2-3 of world size 4, which never started"
    assert summary in res.stdout
    assert "WORLD_SIZE=4" in res.stdout and "--hosts" in res.stdout

    async def call() -> dict[str, object]:
        async with Client(build_server()) as client:
            got = await client.call_tool("dump_stacks", {"pid": int(pid), "window_s": 0.5})
            assert not got.is_error, got.content
            return got.structured_content or {}

    verdict = anyio.run(call)["verdict"]
    assert isinstance(verdict, dict) and verdict["kind"] == "startup" and verdict["suspect_ranks"] == [2, 3]
    assert str(verdict["summary"]).startswith(summary)
