"""The bytes an agent must read on rankscope's shortest path through each incident.

Deterministic for the dead-job incidents (the leftovers are files in this repository); the live
ones start their job (``--live``), measure, and stop it. The path is the one SKILL.md prescribes:
read SKILL.md, make the first call its decision table names (over MCP, through the real server
in process: the text block a client hands the model, and the structured content), then read the
one section the answer's first next step names (``rankscope skill <section>``). Beside it, the
raw evidence a shell agent would have to read to see the same facts: every leftover file, or
every rank's ``py-spy dump``. An incident whose job.json names a ``first_call`` (files the ranks
saved, as ``check_tensor_consistency`` reads them) makes that call instead, and its raw evidence is a
listing of those files: every tensor's name and shape, each scalar's value. Whether the first answer blames the truth's ranks is printed as
a check of the tool, not of an agent.

    PYTHONPATH=tools python benchmarks/agent/bytecost.py [--live] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from incidents import Incident, all_incidents, culprits, set_up, stop

from rankscope import api
from rankscope.mcp_server import build_server


def _call(tool: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    async def main() -> tuple[str, dict[str, Any]]:
        async with Client(build_server()) as client:
            result = await client.call_tool(tool, arguments)
            text = "".join(getattr(block, "text", "") for block in result.content)
            return text, dict(result.structured_content or {})

    return anyio.run(main)


def _first_section(data: dict[str, Any]) -> str:
    steps = list((data.get("verdict") or {}).get("next_steps") or data.get("next_steps") or [])
    for finding in data.get("findings") or []:
        steps.extend(finding.get("next_steps") or [])
    return next((s["skill_section"] for s in steps if s.get("skill_section")), "")


def _pyspy_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        out = subprocess.run(
            ["py-spy", "dump", "--pid", str(pid)], capture_output=True, timeout=60, check=False
        )
        total += len(out.stdout)
    return total


def _saved_bytes(folder: Path) -> int:
    """What a shell agent prints to see the same facts in per-rank torch.save files: every tensor's name
    and shape, with the value of each scalar (a step count), one line each; plus the files that are text."""
    import torch

    total = 0
    for f in sorted(folder.iterdir()):
        if f.suffix != ".pt":
            total += f.stat().st_size if f.is_file() else 0
            continue
        rows: list[tuple[str, Any]] = []
        todo: list[tuple[str, Any]] = [("", torch.load(f, weights_only=True))]
        while todo:
            name, obj = todo.pop()
            if isinstance(obj, dict):
                todo.extend((f"{name}.{k}".lstrip("."), v) for k, v in obj.items())
            elif isinstance(obj, (list, tuple)):
                todo.extend((f"{name}.{i}", v) for i, v in enumerate(obj))
            else:
                rows.append((name, obj))
        for name, obj in rows:
            small = not isinstance(obj, torch.Tensor) or obj.numel() == 1
            shown = (
                obj.item() if isinstance(obj, torch.Tensor) and small else obj if small else list(obj.shape)
            )
            total += len(f"{f.name} {name} {shown}\n".encode())
    return total


def _suspects(data: dict[str, Any]) -> list[int]:
    """The ranks the first answer blames: a verdict's suspects, or the ranks a comparison finds apart."""
    if "divergent" in data or "causes" in data:
        return sorted({r for d in data.get("divergent") or [] if not d.get("tie") for r in d["ranks"]})
    found: list[int] = (data.get("verdict") or {}).get("suspect_ranks", data.get("suspect_ranks", []))
    return found


def measure(incident: Incident, workdir: Path) -> dict[str, Any]:
    pid = set_up(incident, workdir)
    try:
        if pid is None:
            leftovers = workdir / "leftovers"
            tool, arguments = "triage_logs", {"paths": [str(leftovers)]}
            raw = sum(p.stat().st_size for p in leftovers.rglob("*") if p.is_file())
        elif first := incident.spec.get("first_call"):  # files the ranks saved, read by their own tool
            tool, arguments = first["tool"], {"path": str(workdir / first["path"])}
            raw = _saved_bytes(workdir / first["path"])
        else:
            tool, arguments = "dump_stacks", {"pid": pid}
        text, data = _call(tool, arguments)
        if pid is not None and tool == "dump_stacks":  # torchrun's workers are its children
            children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
            raw = _pyspy_bytes([int(x) for x in children.stdout.split()])
    finally:
        stop(workdir)
    section = _first_section(data)
    section_bytes = len(api.read_skill(section).text.encode()) if section else 0
    skill = len(api.skill_md().read_bytes())
    suspects = _suspects(data)
    answer = len(text.encode())
    return {
        "incident": incident.name,
        "first_call": tool,
        "skill_md": skill,
        "answer_text": answer,
        "answer_json": len(json.dumps(data, separators=(",", ":")).encode()),
        "section": section,
        "section_bytes": section_bytes,
        "path_bytes": skill + answer + section_bytes,
        "steps": 3 if section else 2,
        "raw_evidence_bytes": raw,
        "kind": (data.get("verdict") or {}).get(
            "kind", (data.get("causes") or [data.get("summary", "")])[0][:60]
        ),
        "suspects": suspects,
        "truth_culprits": culprits().get(incident.name, []),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--live", action="store_true", help="also start and measure the live incidents")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--incident", default=None, help="measure this incident only")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bytecost-") as tmp:
        for incident in all_incidents():
            if args.incident and incident.name != args.incident:
                continue
            if incident.live and not args.live:
                continue
            if incident.multinode:  # its first call is made from a login node over ssh: measured by its arms
                continue
            rows.append(measure(incident, Path(tmp) / incident.name))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        "| incident | first call | SKILL.md | answer (text) | section | path total | steps | raw evidence | first answer blames | truth |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['incident']} | `{r['first_call']}` | {r['skill_md']} | {r['answer_text']} | "
            f"{r['section'] or '-'} ({r['section_bytes']}) | {r['path_bytes']} | {r['steps']} | {r['raw_evidence_bytes']} | "
            f"{r['suspects']} | {r['truth_culprits']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
