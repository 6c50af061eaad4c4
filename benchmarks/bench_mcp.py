"""MCP server costs: start-up, and the bytes a dump_stacks answer puts in the agent's context.

    .venv/bin/python benchmarks/bench_mcp.py [--runs N] [--out benchmarks/results/mcp.md]

1. Start-up: spawn -> initialize -> the `tools/list` answer, for `rankscope mcp` and for a
   minimal MCPServer with one tool, measured alternately in the same run (median of N).
   Both speak raw JSON-RPC over stdio, so no client library is timed. After the answer,
   /proc/PID/maps of the rankscope server is checked for libtorch: torch must not load
   until a tool needs it.
2. Context size: a 64-rank job with native frames, built from the real captured py-spy
   dumps in tests/data/stacks/ (63 ranks in all_reduce, one in barrier), run through the
   same analysis and bounding as the MCP tool. Compared with the raw `py-spy dump --json`
   output of the same 64 ranks.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CAPTURED = ROOT / "tests" / "data" / "stacks" / "mismatch_barrier_native.json"

MINIMAL_SERVER = """
from mcp.server.mcpserver import MCPServer
server = MCPServer(name="minimal")
@server.tool()
def ping(x: int) -> int:
    \"\"\"Echo.\"\"\"
    return x
server.run("stdio")
"""


def _send(proc: subprocess.Popen[bytes], msg: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(msg) + "\n").encode())
    proc.stdin.flush()


def _recv(proc: subprocess.Popen[bytes], want_id: int) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("server closed stdout")
        msg: dict[str, Any] = json.loads(line)
        if msg.get("id") == want_id:
            return msg


def time_to_tools_list(
    argv: list[str], extra_env: dict[str, str] | None = None
) -> tuple[float, float, int, bool]:
    """Seconds from spawn to the tools/list answer, the server's CPU seconds up to its exit
    (start-up, the answer, and a clean shutdown on EOF), the number of tools, and whether
    libtorch is mapped."""
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": tempfile.gettempdir(),
        "OMP_NUM_THREADS": "1",
        **(extra_env or {}),
    }
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    try:
        _send(
            proc,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "0"},
                },
            },
        )
        _recv(proc, 1)
        _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        answer = _recv(proc, 2)
        elapsed = time.perf_counter() - start
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert proc.stdin is not None
        proc.stdin.close()
        cpu = _wait_cpu(proc)
        return elapsed, cpu, len(answer["result"]["tools"]), "libtorch" in maps
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait(timeout=10)


def _wait_cpu(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> float:
    """Reap ``proc`` (killing it after ``timeout`` s) and return its user + system CPU seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        time.sleep(0.01)
    proc.kill()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def bench_startup(runs: int) -> dict[str, Any]:
    variants = {
        "rankscope": [str(BIN / "rankscope"), "mcp"],
        "rankscope_cold": [str(BIN / "rankscope"), "mcp"],
        "server_only": [sys.executable, "-c", "from rankscope.mcp_server import serve; serve()"],
        "minimal": [sys.executable, "-c", MINIMAL_SERVER],
    }
    # rankscope_cold: the output schema cache turned off, i.e. the very first start
    envs = {"rankscope_cold": {"RANKSCOPE_CACHE_DIR": ""}}
    for name, argv in variants.items():  # warm the page cache (and the schema cache) before measuring
        time_to_tools_list(argv, envs.get(name))
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    tools = 0
    torch_loaded = False
    load_before = os.getloadavg()[0]
    for _ in range(runs):  # alternate so every variant sees the same machine load
        for name, argv in variants.items():
            t, cpu, n, loaded = time_to_tools_list(argv, envs.get(name))
            times[name].append(t)
            cpus[name].append(cpu)
            if name == "rankscope":
                tools, torch_loaded = n, torch_loaded or loaded
    med = {name: statistics.median(ts) for name, ts in times.items()}
    cpu_med = {name: statistics.median(ts) for name, ts in cpus.items()}
    return {
        "rankscope_s": med["rankscope"],
        "cold_s": med["rankscope_cold"],
        "cold_cpu": cpu_med["rankscope_cold"],
        "ratio_cold": med["rankscope_cold"] / med["minimal"],
        "server_only_s": med["server_only"],
        "minimal_s": med["minimal"],
        "rankscope_cpu": cpu_med["rankscope"],
        "server_only_cpu": cpu_med["server_only"],
        "minimal_cpu": cpu_med["minimal"],
        "ratio": med["rankscope"] / med["minimal"],
        "ratio_server_only": med["server_only"] / med["minimal"],
        "ratio_cpu": cpu_med["rankscope"] / cpu_med["minimal"],
        "tools": tools,
        "torch_loaded": torch_loaded,
        "load_before": load_before,
        "load": os.getloadavg()[0],
    }


def synthetic_job(world: int = 64) -> tuple[Any, list[Any], list[list[dict[str, Any]]]]:
    """A 64-rank job from real captured dumps: (Job, RankStacks, raw py-spy JSON per rank)."""
    from rankscope.models.core import Job, RankProcess, RankStack
    from rankscope.runtime.pyspy import parse_dump

    data = json.loads(CAPTURED.read_text())
    by_rank = {r["rank"]: r for r in data["ranks"]}
    template_job = data["job"]
    rank_tmpl = template_job["ranks"][0]
    procs: list[RankProcess] = []
    stacks: list[RankStack] = []
    raws: list[list[dict[str, Any]]] = []
    for rank in range(world):
        src = by_rank[1] if rank == world - 1 else by_rank[0]  # the last rank takes the other path
        pid = 100_000 + rank
        raw = copy.deepcopy(src["pyspy"])
        for i, thread in enumerate(raw):
            thread["pid"] = pid
            thread["thread_id"] = 140_000_000_000_000 + rank * 16 + i
            thread["os_thread_id"] = pid + 1000 + i
        raws.append(raw)
        host = f"node{rank // 8}"
        procs.append(
            RankProcess.model_validate(
                {**rank_tmpl, "rank": rank, "local_rank": rank % 8, "pid": pid, "host": host}
            )
        )
        stacks.append(
            RankStack(rank=rank, pid=pid, host=host, state="sleeping", threads=parse_dump(raw, pid))
        )
    job = Job.model_validate(
        {
            **template_job,
            "world_size": world,
            "ranks": [p.model_dump() for p in procs],
            "hosts": sorted({p.host for p in procs}),
        }
    )
    return job, stacks, raws


def bench_context(world: int = 64) -> dict[str, Any]:
    from rankscope import api
    from rankscope.analysis.hang.stacks import analyze

    job, stacks, raws = synthetic_job(world)
    full = analyze(job, stacks, [])
    bounded = api.answer(full)  # what dump_stacks returns by default
    raw_bytes = sum(len(json.dumps(r, indent=2)) for r in raws)  # py-spy dump --json pretty-prints
    raw_compact = sum(len(json.dumps(r)) for r in raws)
    from rankscope.analysis.sizing.fit import size_of
    from rankscope.render.answer import shape_answer

    text, data = shape_answer(bounded)  # what the server sends: text block and structured content
    answer = max(size_of(data), len(text.encode()))
    full_answer = len(full.model_dump_json())
    return {
        "world": world,
        "raw_bytes": raw_bytes,
        "raw_compact_bytes": raw_compact,
        "full_report_bytes": full_answer,
        "answer_bytes": answer,
        "ratio": answer / raw_bytes,
        "ratio_compact": answer / raw_compact,
        "verdict": bounded.verdict.kind,
        "suspects": bounded.verdict.suspect_ranks,
        "frames": sum(len(t.frames) for s in stacks for t in s.threads),
    }


def render(start: dict[str, Any], ctx: dict[str, Any], runs: int) -> str:
    cpu = os.cpu_count()
    return f"""# MCP server benchmarks

Measured by `benchmarks/bench_mcp.py` ({runs} alternating runs, median), on this machine
({cpu} CPUs, shared with other work while measuring).

## Start-up: spawn to the `tools/list` answer

| server | wall seconds (median) | server CPU seconds (median) | tools |
|---|---|---|---|
| minimal MCPServer, one tool | {start["minimal_s"]:.3f} | {start["minimal_cpu"]:.3f} | 1 |
| `rankscope mcp` (console script) | {start["rankscope_s"]:.3f} | {start["rankscope_cpu"]:.3f} | {start["tools"]} |
| `rankscope.mcp_server.serve()` alone | {start["server_only_s"]:.3f} | {start["server_only_cpu"]:.3f} | {start["tools"]} |
| `rankscope mcp`, output schema cache off (a first start) | {start["cold_s"]:.3f} | {start["cold_cpu"]:.3f} | {start["tools"]} |
| **ratio `rankscope mcp` / minimal** | **{start["ratio"]:.2f}×** (target ≤ 1.2×) | {start["ratio_cpu"]:.2f}× | |
| ratio server alone / minimal | {start["ratio_server_only"]:.2f}× | | |
| ratio first start (no schema cache) / minimal | {start["ratio_cold"]:.2f}× | | |

Wall: spawn to the `tools/list` answer. CPU: the server process's user + system time from
spawn to its exit on EOF right after that answer (a steadier measure than wall time on a
shared machine). 1-minute load average {start["load_before"]:.1f} before and {start["load"]:.1f}
after the measurement, on {cpu} CPUs.

libtorch mapped in the rankscope server after `tools/list`: **{"yes" if start["torch_loaded"] else "no"}**
(torch loads only when a tool that needs it runs).

## Context size: default `dump_stacks` answer for {ctx["world"]} ranks with native frames

Built from the real captured dumps in `tests/data/stacks/mismatch_barrier_native.json`
({ctx["world"] - 1} ranks waiting in all_reduce, one in barrier; {ctx["frames"]} frames in all),
through the same analysis and bounding as the MCP tool.

| what | bytes | vs raw py-spy JSON |
|---|---|---|
| raw `py-spy dump --json` of every rank (as printed) | {ctx["raw_bytes"]:,} | 1 |
| raw, re-serialised compactly | {ctx["raw_compact_bytes"]:,} | {ctx["raw_compact_bytes"] / ctx["raw_bytes"]:.2f} |
| full StacksReport (`rankscope stacks --json`) | {ctx["full_report_bytes"]:,} | {ctx["full_report_bytes"] / ctx["raw_bytes"]:.3f} |
| **default `dump_stacks` answer** (the larger of its text block and its compact structured content) | **{ctx["answer_bytes"]:,}** | **{ctx["ratio"]:.3f}** (1/{1 / ctx["ratio"]:.0f}; vs compact raw 1/{1 / ctx["ratio_compact"]:.0f}) |

Targets: ≤ 1/10 of the raw bytes and ≤ 8 KB at any scale (4 KB up to 16 ranks: see answers.md). Verdict in the bounded answer:
`{ctx["verdict"]}`, suspects {ctx["suspects"]}.
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mcp.md"))
    args = parser.parse_args()
    start = bench_startup(args.runs)
    ctx = bench_context()
    text = render(start, ctx, args.runs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
