"""The MCP server in process, through the SDK's own Client: tools, errors, resources, prompts.

One real hung gloo job serves the live calls; the error paths use real processes too
(a pid that does not exist, a non-Python process, a Python process outside any job).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from rankscope.capabilities.skill import all_sections
from rankscope.mcp_server import build_server
from rankscope.resources import playbooks_dir, skill_md
from tests.jobs import JobFactory
from tests.paths import ROOT

T = TypeVar("T")

MY_TOOLS = ("list_jobs", "dump_stacks")
PROMPTS = ("diagnose_hang", "diagnose_crash", "diagnose_wrong_results", "diagnose_oom")


def with_client(fn: Callable[[Client], Awaitable[T]]) -> T:
    async def main() -> T:
        async with Client(build_server()) as client:
            return await fn(client)

    return anyio.run(main)


def call(name: str, args: dict[str, Any]) -> CallToolResult:
    return with_client(lambda c: c.call_tool(name, args))


def error_text(result: CallToolResult) -> str:
    assert result.is_error, f"expected an error, got {result.structured_content}"
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


@pytest.fixture
def idle_children() -> Iterator[dict[str, int]]:
    """A non-Python process and a Python process that belong to no distributed job."""
    sleeper = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
    python = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env={"PATH": os.environ["PATH"]},
    )
    try:
        yield {"sleep": sleeper.pid, "python": python.pid}
    finally:
        for proc in (sleeper, python):
            proc.kill()
            proc.wait(timeout=10)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    return proc.pid


# -- discovery of the server's surface ---------------------------------------------------------


def test_tools_list_names_annotations_and_output_schemas() -> None:
    tools = {t.name: t for t in with_client(lambda c: c.list_tools()).tools}
    for name in MY_TOOLS:
        tool = tools[name]
        assert tool.title and tool.description and len(tool.description) > 80
        ann = tool.annotations
        assert ann is not None
        assert (ann.read_only_hint, ann.destructive_hint, ann.idempotent_hint, ann.open_world_hint) == (
            True,
            False,
            True,
            False,
        )
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
    listed = tools["list_jobs"].output_schema
    out = tools["dump_stacks"].output_schema
    assert listed is not None and out is not None
    assert {"host", "jobs", "errors"} <= set(listed["properties"])
    assert {"job", "groups", "verdict", "stacks", "truncated", "hint"} <= set(out["properties"])
    # the verdict kinds the skill documents are the schema's enum
    kinds = set(out["$defs"]["Verdict"]["properties"]["kind"]["enum"])
    assert kinds == {
        "mismatched_collectives",
        "divergent_ranks",
        "missing_ranks",
        "all_in_same_collective",
        "no_collective",
        "inconclusive",
        "progressing",
        "straggler",
        "busy",
        "startup",
    }
    params = set(tools["dump_stacks"].input_schema["properties"])
    assert params == {
        "pid",
        "native",
        "locals",
        "nonblocking",
        "full_ranks",
        "last",
        "ranks",
        "hosts",
        "via",
        "job",
        "namespace",
        "timeout",
        "counters",
        "flight_recorder",
        "ras",
        "window_s",
        "from_paths",
        "backend",
        "job_id",
        "full",
    }
    assert "ctx" not in tools["list_jobs"].input_schema["properties"]


def test_resources_serve_skill_md_and_every_playbook() -> None:
    async def read_all(c: Client) -> tuple[list[str], dict[str, str]]:
        listed = [str(r.uri) for r in (await c.list_resources()).resources]
        texts: dict[str, str] = {}
        for uri in listed:
            res = await c.read_resource(uri)
            block = res.contents[0]
            texts[uri] = getattr(block, "text", "")
            assert block.mime_type == "text/markdown"
        return listed, texts

    listed, texts = with_client(read_all)
    expected = ["rankscope://skill/SKILL.md"] + [
        f"rankscope://skill/{p.name}" for p in sorted(playbooks_dir().glob("*.md"))
    ]
    sections = [f"rankscope://{s.link}" for s in all_sections()]  # each section is a resource of its own
    assert sorted(listed) == sorted(expected + sections)
    assert "rankscope://skill/hangs.md" in listed
    original = skill_md().read_text(encoding="utf-8")
    served = texts["rankscope://skill/SKILL.md"]
    # links resolve beside SKILL.md: skill/hangs.md -> hangs.md -> rankscope://skill/hangs.md
    assert "](skill/hangs.md" in original and "](skill/" not in served and "](hangs.md" in served
    assert served.replace("](", "](skill/").count("](skill/") >= original.count("](skill/")
    assert "## Mismatched collectives" in texts["rankscope://skill/hangs.md"]


def test_playbook_links_with_a_section_resolve() -> None:
    async def read(c: Client) -> str:
        res = await c.read_resource("rankscope://skill/hangs.md#nccl-hangs")
        return getattr(res.contents[0], "text", "")

    text = with_client(read)
    assert text.startswith("## NCCL hangs") and "## Mismatched collectives" not in text  # the section alone


def test_prompts_for_the_main_procedures() -> None:
    async def get(c: Client) -> tuple[list[str], str, str]:
        names = [p.name for p in (await c.list_prompts()).prompts]
        hang = await c.get_prompt("diagnose_hang", {"pid": "4242"})
        oom = await c.get_prompt("diagnose_oom", {"snapshot_dir": "/data/snaps"})
        h, o = hang.messages[0].content, oom.messages[0].content
        assert isinstance(h, TextContent) and isinstance(o, TextContent)
        return names, h.text, o.text

    names, hang, oom = with_client(get)
    assert set(PROMPTS) <= set(names)
    assert "dump_stacks on pid=4242" in hang and "list_jobs" in hang
    for kind in (
        "mismatched_collectives",
        "divergent_ranks",
        "missing_ranks",
        "all_in_same_collective",
        "no_collective",
    ):
        assert kind in hang
    assert "Root cause" in hang and "rankscope://skill/hangs.md" in hang
    assert "/data/snaps" in oom and "inspect_memory" in oom and "empty_cache" in oom


# -- error paths: every one is a ToolError whose text carries the fix ---------------------------


@pytest.mark.parametrize(
    ("tool", "args", "expected"),
    [
        (
            "list_jobs",
            {"pid": -1},
            "pid (--pid) must be a positive process id, got -1. Fix: Run `rankscope ps` (MCP: list_jobs)",
        ),
        ("dump_stacks", {"pid": 0}, "pid (--pid) must be a positive process id, got 0. Fix:"),
        (
            "dump_stacks",
            {"timeout": 0},
            "timeout (--timeout) must be positive, got 0. Fix: Pass a timeout in seconds",
        ),
        (
            "dump_stacks",
            {"full_ranks": [-2]},
            "full_ranks (--show-rank) must be a list of rank numbers (0 and up), got [-2]. Fix:",
        ),
        ("dump_stacks", {"hosts": []}, "hosts (--hosts) is empty. Fix: Leave it out for this host"),
        (
            "dump_stacks",
            {"ranks": [-1]},
            "ranks (--only-rank) must be a non-empty list of rank numbers (0 and up), got [-1]. Fix:",
        ),
        (
            "dump_stacks",
            {"ranks": [0], "via": "srun"},
            "ranks (--only-rank) selects ranks on this host only; it cannot be combined with hosts, via, job or "
            "namespace. Fix:",
        ),
        (
            "dump_stacks",
            {"via": "kubectl"},
            "--via kubectl needs --hosts PODS or --job JOBNAME Fix: Pass --job",
        ),
        (
            "dump_stacks",
            {"via": "srun"},
            "no Slurm allocation in the environment (SLURM_JOB_ID is unset). Fix: Pass job=JOBID",
        ),
        ("dump_stacks", {"hosts": ["node[01-03"]}, "unbalanced '[' in hostlist 'node[01-03' Fix:"),
        (
            "dump_stacks",
            {"via": "telnet"},
            "Invalid arguments for dump_stacks: via should be 'ssh', 'srun', 'kubectl' or 'debug-server' "
            "(got 'telnet'). Fix: via: How to reach other hosts",
        ),
        ("dump_stacks", {"pid": "abc"}, "pid (--pid) must be a process id or HOST:PID, got 'abc'. Fix:"),
    ],
)
def test_bad_arguments_are_tool_errors_with_the_fix(
    tool: str, args: dict[str, Any], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLURM_JOB_NODELIST", "SLURM_JOB_ID"):  # the srun case must not find an allocation
        monkeypatch.delenv(name, raising=False)
    text = error_text(call(tool, args))
    assert expected in text
    assert "Traceback" not in text


@pytest.mark.parametrize("tool", MY_TOOLS)
def test_pid_that_does_not_exist(tool: str) -> None:
    pid = _dead_pid()
    text = error_text(call(tool, {"pid": pid}))
    assert f"No process with pid {pid} on this host" in text
    assert "Fix: Run `rankscope ps`" in text


@pytest.mark.parametrize("tool", MY_TOOLS)
def test_pid_outside_any_job(tool: str, idle_children: dict[str, int]) -> None:
    sleep_pid, py_pid = idle_children["sleep"], idle_children["python"]
    text = error_text(call(tool, {"pid": sleep_pid}))
    assert f"Process {sleep_pid} (sleep 300) is not a Python process" in text
    assert "Fix: Pass the pid of a rank or of its launcher" in text
    text = error_text(call(tool, {"pid": py_pid}))
    assert "is a Python process but not part of a distributed PyTorch job" in text
    assert "Fix: Pass the pid of a rank or of its launcher" in text


# -- a live hung job ----------------------------------------------------------------------------


@pytest.mark.slow
def test_list_jobs_and_dump_stacks_on_a_hung_job(jobs: JobFactory, pyspy_works: str) -> None:
    job = jobs.torchrun("mcp_hang.py", nproc=2, args=["--mode", "divergent"])
    job.wait_ready(["rank0", "rank1"])
    ranks = job.rank_pids()

    async def session(c: Client) -> dict[str, Any]:
        listed = await c.call_tool("list_jobs", {"pid": job.pid, "details": True})
        assert not listed.is_error, listed.content
        brief = await c.call_tool("list_jobs", {"pid": job.pid})
        assert not brief.is_error, brief.content
        (short,) = (brief.structured_content or {})["jobs"]  # every rank, as the plain view lists them
        assert [(r["rank"], r["local_rank"], r["rank_source"]) for r in short["ranks"]] == [
            (0, 0, "env:RANK"),
            (1, 1, "env:RANK"),
        ]
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        # rank 0 marks itself ready just before all_reduce: poll until it is inside it
        report: dict[str, Any] = {}
        with anyio.fail_after(60):
            while report.get("verdict", {}).get("kind") != "divergent_ranks":
                seen.clear()
                res = await c.call_tool("dump_stacks", {"pid": job.pid}, progress_callback=on_progress)
                assert not res.is_error, res.content
                report = res.structured_content or {}
        # the hint followed literally: more of the same capture, never a new verdict
        again = await c.call_tool("dump_stacks", {"last": True, "full_ranks": [1]})
        assert not again.is_error, again.content
        full = await c.call_tool("dump_stacks", {"pid": ranks[0], "full_ranks": [1]})
        assert not full.is_error, full.content
        only_seen: list[tuple[float, float | None, str | None]] = []

        async def on_only(progress: float, total: float | None, message: str | None) -> None:
            only_seen.append((progress, total, message))

        only = await c.call_tool(
            "dump_stacks", {"pid": job.pid, "ranks": [1], "full_ranks": [1]}, progress_callback=on_only
        )
        assert not only.is_error, only.content
        return {
            "again": again.structured_content,
            "only": only.structured_content,
            "listed": listed.structured_content,
            "report": report,
            # the job's own files and interpreter lie in the checkout: its path's length is not the answer's
            "size": len(json.dumps(report).replace(str(ROOT), "<checkout>")),
            "progress": list(seen),
            "only_progress": list(only_seen),
            "full": full.structured_content,
        }

    out = with_client(session)
    listed = out["listed"]
    (found,) = listed["jobs"]
    assert found["launcher"] == "torchrun" and found["launcher_pid"] == job.pid and found["world_size"] == 2
    assert {r["rank"]: r["pid"] for r in found["ranks"]}.keys() == {0, 1}
    assert {r["pid"] for r in found["ranks"]} <= set(ranks)

    report = out["report"]
    verdict = report["verdict"]
    assert verdict["suspect_ranks"] == [1]
    assert "rank 1" in verdict["summary"] and "all_reduce" in verdict["summary"]
    assert any(s["skill_section"] == "skill/hangs.md#divergent-ranks" for s in verdict["next_steps"])
    # bounded: groups and verdict, no per-rank stacks unless asked, and a hint saying how to get them
    assert out["size"] <= 4_000
    assert report["truncated"] is True and "full_ranks" in report["hint"]
    assert [(s["rank"], s.get("threads")) for s in report["stacks"]] == [
        (1, None)
    ]  # the suspect, without its stack
    ops = {g.get("op") for g in report["groups"]}
    assert "all_reduce" in ops
    assert [p[0] for p in out["progress"]] == [0, 1, 2, 3]
    assert out["progress"][-1][2] == "verdict: divergent_ranks"

    full = out["full"]
    assert [s["rank"] for s in full["stacks"]] == [1]
    frames = [f["function"] for t in full["stacks"][0]["threads"] for f in t["frames"]]
    assert "wait_for_config_reload" in frames

    again = out["again"]
    assert again["verdict"] == report["verdict"] and [s["rank"] for s in again["stacks"]] == [1]
    assert again["stacks"][0]["threads"]

    only = out["only"]  # ranks=[1]: rank 1 alone was captured, and the answer says so
    assert [s["rank"] for s in only["stacks"]] == [1]
    assert {r for g in only["groups"] for r in g["ranks"]} == {1}
    assert any("only ranks [1] were captured" in n for n in only["job"]["notes"])
    assert only["verdict"]["summary"].startswith("this verdict covers only rank 1 (captured alone)")
    assert only["only_ranks"] == [1]
    # the progress line a client shows says as much: never "verdict: <kind>" for one rank's capture
    assert out["only_progress"][-1][2].startswith("verdict on rank 1 alone: "), out["only_progress"]
    assert (
        "the last capture of every rank said divergent_ranks, suspects: rank(s) 1"
        in only["verdict"]["summary"]
    )
    frames = [f["function"] for t in only["stacks"][0]["threads"] for f in t["frames"]]
    assert "wait_for_config_reload" in frames


def test_building_the_server_does_not_import_torch() -> None:
    """Start-up stays cheap: torch loads only when a tool that needs it runs (the CLI too)."""
    code = (
        "import sys; from rankscope.mcp_server import build_server; build_server(); "
        "import rankscope.api, rankscope.cli; rankscope.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'numpy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


SCHEMAS_CODE = """
import json, anyio
from mcp import Client
from rankscope.mcp_server import build_server

async def main():
    server = build_server()
    async with Client(server) as client:
        tools = {t.name: t.output_schema for t in (await client.list_tools()).tools}
        listed = await client.call_tool("list_jobs", {})
    assert not listed.is_error, listed.content
    print(json.dumps({"tools": tools, "listed": sorted(listed.structured_content)}, sort_keys=True))

anyio.run(main)
"""


def _schemas(cache_dir: str) -> dict[str, Any]:
    env = {**os.environ, "RANKSCOPE_CACHE_DIR": cache_dir}
    out = subprocess.run(
        [sys.executable, "-c", SCHEMAS_CODE], capture_output=True, text=True, timeout=120, env=env, cwd="/"
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_output_schema_cache_serves_what_the_sdk_derives(tmp_path: Path) -> None:
    """A fresh start derives the output schemas and caches them; the next start serves the cached ones,
    identical, and still validates structured output; a cache with another key is ignored."""
    derived = _schemas("")  # cache off: the SDK derives every schema
    assert derived == _schemas(str(tmp_path))  # derived again, and written
    cache_file = tmp_path / "mcp-output-schemas.json"
    cached = json.loads(cache_file.read_text())
    assert set(cached["tools"]) == set(derived["tools"])
    # prove the next start reads the file: mark one cached schema
    cached["tools"]["list_jobs"]["schema"]["title"] = "from-the-cache"
    cache_file.write_text(json.dumps(cached))
    marked = _schemas(str(tmp_path))
    assert marked["tools"]["list_jobs"]["title"] == "from-the-cache"
    assert marked["listed"] == derived["listed"]
    assert {k: v for k, v in marked["tools"].items() if k != "list_jobs"} == {
        k: v for k, v in derived["tools"].items() if k != "list_jobs"
    }
    # a cache written for other models (another key) is never served
    cached["key"] = "stale"
    cache_file.write_text(json.dumps(cached))
    assert _schemas(str(tmp_path)) == derived
