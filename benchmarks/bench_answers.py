"""Answer sizes: what each MCP tool hands a model, beside what the model would read without rankscope.

Every answer is taken over the wire, from an in-memory MCP client of the real server, in both
forms clients pass to their model: the text block and the structured content (as compact JSON,
the way Claude Code and VS Code stringify it). The hang answers are for jobs of 2, 8 and 32
ranks built from a real capture (tests/data/stacks/mismatch_barrier.json: one rank in a barrier
while the others wait in all_reduce, 2 threads per rank), saved as py-spy JSON dumps and read
back with ``dump_stacks(from_paths=...)``; the baseline is the plain ``py-spy dump`` text of the
same ranks, written the way py-spy prints it (its short file names, one line per frame).

Targets (issue: answers sized for a model): dump_stacks at most half of the plain dumps at 8
ranks and at most a fifth at 32; every answer at most 4 KB for up to 16 ranks and 8 KB at any
scale. Run: ``.venv/bin/python benchmarks/bench_answers.py``; writes results/answers.md.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
CAPTURE = ROOT / "tests" / "data" / "stacks" / "mismatch_barrier.json"
DATA = ROOT / "tests" / "data"
RESULTS = Path(__file__).resolve().parent / "results" / "answers.md"


def pyspy_text(pid: int, cmdline: str, threads: list[dict[str, Any]]) -> str:
    """``py-spy dump --pid PID`` as py-spy prints it."""
    lines = [f"Process {pid}: {cmdline}", "Python v3.11.7 (/usr/bin/python3.11)", ""]
    for t in threads:
        state = "active" if t.get("active") else "idle"
        lines.append(f'Thread {t["os_thread_id"]} ({state}): "{t.get("thread_name") or ""}"')
        lines += [f"    {f['name']} ({f['short_filename']}:{f['line']})" for f in t["frames"]]
    return "\n".join(lines) + "\n"


def hang_dumps(world: int, folder: Path) -> int:
    """Write ``world`` ranks' py-spy JSON dumps; return the bytes of their plain text dumps."""
    data = json.loads(CAPTURE.read_text())
    by_rank = {r["rank"]: r for r in data["ranks"]}
    cmdline = " ".join(data["job"]["ranks"][0]["cmdline"])
    plain = 0
    for rank in range(world):
        src = by_rank[2] if rank == world - 1 else by_rank[0]  # the last rank is in the barrier
        pid = 200_000 + rank
        raw = copy.deepcopy(src["pyspy"])
        for i, thread in enumerate(raw):
            thread["pid"] = pid
            thread["os_thread_id"] = pid + i
        (folder / f"stacks_rank_{rank}.json").write_text(json.dumps(raw))
        plain += len(pyspy_text(pid, cmdline, raw).encode())
    return plain


async def call(client: Any, name: str, args: dict[str, Any]) -> tuple[int, int, bool]:
    res = await client.call_tool(name, args)
    text = "".join(c.text for c in res.content if getattr(c, "text", None))
    data = (
        len(json.dumps(res.structured_content, separators=(",", ":")).encode())
        if res.structured_content
        else 0
    )
    return len(text.encode()), data, bool(res.is_error)


async def measure() -> dict[str, Any]:
    from mcp import Client

    from rankscope.mcp_server import build_server

    rows: list[dict[str, Any]] = []
    async with Client(build_server()) as client:
        tools = await client.list_tools()
        listed = len(
            json.dumps([t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools.tools])
        )
        for world in (2, 8, 32):
            with tempfile.TemporaryDirectory() as tmp:
                plain = hang_dumps(world, Path(tmp))
                text, data, err = await call(client, "dump_stacks", {"from_paths": [tmp], "backend": "gloo"})
                full_text, full_data, _ = await call(
                    client, "dump_stacks", {"from_paths": [tmp], "backend": "gloo", "full": True}
                )
            rows.append(
                {"tool": f"dump_stacks, {world} ranks", "text": text, "data": data, "plain": plain, "error": err,
                 "full": max(full_text, full_data)}
            )  # fmt: skip
        others: list[tuple[str, dict[str, Any]]] = [
            ("list_jobs", {}),  # whatever runs on this host when it is measured
            ("triage_logs", {"paths": [str(DATA / "logs")]}),
            ("analyze_flight_recorder", {"paths": [str(DATA / "flight" / "nccl_dtype")]}),
            ("collect_env", {"include_torch": False}),
            ("list_repro_templates", {}),
            ("generate_repro", {"name": "skip_collective"}),
            (
                "memory_budget",
                {"placement": str(DATA / "probe" / "rootonly_placement-rank0.json"), "gpu_memory": "80GiB"},
            ),
            ("inspect_placements", {"path": str(DATA / "probe" / "dcp_fsdp2")}),
        ]
        for name, args in others:
            text, data, err = await call(client, name, args)
            full_text, full_data, _ = await call(client, name, {**args, "full": True})
            rows.append({"tool": name, "text": text, "data": data, "plain": None, "error": err,
                         "full": max(full_text, full_data)})  # fmt: skip
    return {"rows": rows, "tools_list": listed, "load": os.getloadavg()[0]}


def render(result: dict[str, Any]) -> str:
    out = [
        "# Answer sizes",
        "",
        "Bytes a model reads per tool answer, over the wire from the real server (in-memory MCP client):",
        "the text block, and the structured content as compact JSON (what Claude Code and VS Code pass).",
        "`plain` is `py-spy dump` text of the same ranks; `full=true` is the unbounded answer.",
        "",
        "| answer | text block | structured | plain py-spy text | ratio (larger form / plain) | full=true |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        big = max(r["text"], r["data"])
        ratio = f"{big / r['plain']:.2f}" if r["plain"] else "—"
        plain = f"{r['plain']:,}" if r["plain"] else "—"
        flag = " (error)" if r["error"] else ""
        out.append(
            f"| {r['tool']}{flag} | {r['text']:,} | {r['data']:,} | {plain} | {ratio} | {r['full']:,} |"
        )
    out += [
        "",
        f"`tools/list`: {result['tools_list']:,} bytes for all tools.",
        "",
        "`triage_logs` reads every fixture log at once (tests/data/logs: many unrelated jobs), the",
        "worst case for one answer; one job's logs answer in at most 4 KiB each (tests/unit/test_answers.py).",
        "`generate_repro` without `out` returns the script itself, which is most of its size.",
        "",
    ]
    return "\n".join(out)


def main() -> int:
    result = anyio.run(measure)
    text = render(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
