"""The skill over MCP: SKILL.md and its playbooks as resources, the procedures as prompts.

For harnesses without Agent Skills support, the same decision procedure is
reachable through MCP: ``rankscope://skill/SKILL.md``,
``rankscope://skill/<playbook>.md`` and each section,
``rankscope://skill/<playbook>.md#<anchor>``, are resources read from the installed
files (so they never drift from SKILL.md), and each main procedure is a prompt
that starts the agent on the right first tool.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.mcpserver.resources import FileResource, TextResource

from rankscope import api
from rankscope.errors import RankscopeError

log = logging.getLogger("rankscope.mcp")

URI_PREFIX = "rankscope://skill/"

_SUMMARY = (
    "End with an incident summary for the engineer: Symptom (what was seen), Evidence (tool answers: "
    "verdict kind, suspect ranks, file:line), Root cause, Fix (the code or config change, and why it works), "
    "Repro (the generate_repro script and its verification, if one was made)."
)


def _first_heading(path: Path) -> str | None:
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    except OSError:
        return None
    return None


def skill_files() -> list[Path]:
    """SKILL.md followed by every playbook in skill/, sorted; empty when the files are missing."""
    try:
        files = [api.skill_md()]
        folder = api.playbooks_dir()
    except RankscopeError as exc:
        log.warning("skill resources unavailable: %s", exc)
        return []
    if folder.is_dir():
        files.extend(sorted(p for p in folder.glob("*.md") if p.is_file()))
    return files


def _register_resources(server: MCPServer) -> None:
    for path in skill_files():
        is_root = path.name == "SKILL.md"
        title = "rankscope skill: the decision procedure" if is_root else (_first_heading(path) or path.stem)
        description = (
            "Classify the symptom (hang, crash, communication error, wrong results, OOM, sharding), then the "
            "first tool, how to read its answer, the next tool and the fixes."
            if is_root
            else f"Playbook loaded on demand from SKILL.md: {title}."
        )
        if is_root:
            # SKILL.md links its playbooks as skill/<name>.md; served at rankscope://skill/SKILL.md those
            # links must read <name>.md to resolve to rankscope://skill/<name>.md
            server.add_resource(
                TextResource(
                    uri=URI_PREFIX + path.name,
                    name=path.name,
                    title=title,
                    description=description,
                    mime_type="text/markdown",
                    text=_links_beside(path.read_text(encoding="utf-8")),
                )
            )
            continue
        server.add_resource(
            FileResource(
                uri=URI_PREFIX + path.name,
                name=f"skill/{path.name}",
                title=title,
                description=description,
                mime_type="text/markdown",
                path=path.resolve(),
            )
        )
    _register_section_template(server)


def _links_beside(text: str) -> str:
    """``](skill/hangs.md#x)`` -> ``](hangs.md#x)``: the playbooks sit beside SKILL.md as resources."""
    return re.sub(r"\]\(skill/([\w.-]+\.md)", r"](\1", text)


def _register_section_template(server: MCPServer) -> None:
    """One resource per playbook section, ``rankscope://skill/hangs.md#progress-counters`` (what every
    ``skill_section`` in an answer names, with ``rankscope://`` in front), and a template that reads
    any other spelling of a section the same way: a section, never the whole playbook, is read."""
    try:
        sections = api.all_sections()
    except (RankscopeError, OSError) as exc:
        log.warning("skill sections unavailable: %s", exc)
        sections = []
    for section in sections:
        server.add_resource(
            TextResource(
                uri=f"rankscope://{section.link}",
                name=section.ref,
                title=section.title,
                description=f"One section of skill/{section.playbook}.md.",
                mime_type="text/markdown",
                text=section.text,
            )
        )

    @server.resource(
        URI_PREFIX + "{name}{#section}",
        name="skill-section",
        title="One section of a playbook, addressed as an answer's skill_section names it",
        mime_type="text/markdown",
    )
    def read_section(name: str, section: str) -> str:
        if name == "SKILL.md" and not section:
            return _links_beside(api.skill_md().read_text(encoding="utf-8"))
        if "/" in name or not name.endswith(".md"):
            raise ResourceNotFoundError(f"no playbook {name!r}: read rankscope://skill/SKILL.md for the list")
        try:
            answer = api.read_skill(f"{name}#{section}")
        except RankscopeError as exc:
            raise ResourceNotFoundError(exc.render()) from exc
        return answer.text + "".join(f"\n- {ref}" for ref in answer.sections)


def diagnose_hang(pid: str = "") -> str:
    """Diagnose a distributed job that is stuck (no progress, NCCL/Gloo watchdog timeout pending)."""
    target = f"pid={pid}" if pid else "the job list_jobs finds"
    return (
        f"A distributed PyTorch job appears hung. Diagnose it with rankscope, following "
        f"{URI_PREFIX}hangs.md.\n"
        f"1. list_jobs (with pid={pid} if given) to find the job, its world size and missing_ranks.\n"
        f"2. dump_stacks on {target}. Read verdict.kind and verdict.suspect_ranks:\n"
        "   - mismatched_collectives: ranks wait in different collectives; compare the groups' call sites.\n"
        "   - divergent_ranks: some ranks are outside any collective; their call site is the bug.\n"
        "   - missing_ranks: a rank exited or runs elsewhere; triage_logs on its logs, or dump_stacks with hosts.\n"
        "   - all_in_same_collective: the culprit is not on this host or the transport is stuck; dump_stacks "
        "with hosts=[...], or analyze_flight_recorder on the dumps; collect_env for network settings.\n"
        "   - no_collective: not a communication hang; look at the busiest frames (DataLoader, I/O, a lock).\n"
        "   - inconclusive: retry with native=True, or fix the capture errors it lists.\n"
        "3. Follow verdict.next_steps; use full_ranks=[...] only for the suspects.\n"
        "4. Once the cause is clear, generate_repro for its class and check that it reproduces.\n"
        "Do not suggest CUDA_LAUNCH_BLOCKING=1 for a hang in production: it serialises every kernel and can hide "
        f"or move the hang. {_SUMMARY}"
    )


def diagnose_crash(log_path: str = "") -> str:
    """Diagnose a crashed job or a killed worker (torchrun ChildFailedError, SIGKILL, exit code -9)."""
    where = f" The logs are at {log_path}." if log_path else ""
    return (
        "A distributed PyTorch job crashed or one of its workers was killed." + where + " Follow "
        f"{URI_PREFIX}SKILL.md (crash section) and {URI_PREFIX}crashes.md.\n"
        "1. triage_logs on every rank's log (a folder of per-rank logs is fine). The first error in time is "
        "usually the root cause; ranks reporting 'Connection closed by peer' or a watchdog timeout are victims "
        "waiting for it. torchrun's 'Root Cause (first observed failure)' names the first rank to exit, not "
        "necessarily the cause.\n"
        "2. For SIGKILL / exit -9 / exitcode -9: check host memory (OOM killer) with inspect_memory and "
        "collect_env (/dev/shm size for DataLoader workers).\n"
        "3. For NCCL/Gloo errors, collect_env: variables that differ across ranks, interfaces, versions.\n"
        "4. If the job still runs but is stuck, switch to the hang procedure (dump_stacks).\n"
        f"5. generate_repro for the failure class once it is known. {_SUMMARY}"
    )


def diagnose_wrong_results(pid: str = "") -> str:
    """Diagnose ranks that compute different results (loss or weights differ, divergence only at scale)."""
    return (
        "Ranks of a distributed PyTorch job compute different results. Follow "
        f"{URI_PREFIX}wrong-results.md.\n"
        "1. Have every rank call rankscope.probe.check_consistency(model, which='all') in the job, or "
        "rankscope.probe.dump(model, DIR, which='all') and then check_tensor_consistency(path=DIR): find the "
        "first divergent tensor in module order and the ranks that disagree with the majority.\n"
        "2. Parameters differ from step 0: the initial weights were not synchronised (DDP broadcasts them at "
        "construction; a model changed after wrapping or a hand-written loop is not). BatchNorm buffers differ: "
        "no SyncBatchNorm, with broadcast_buffers=False or without DDP. Gradients differ: a rank-dependent code "
        "path. NaN/Inf on one rank: that rank's data or an overflow.\n"
        "3. For DTensor/FSDP questions, inspect_placements: shards legitimately differ; compare only replicas.\n"
        f"4. generate_repro for the class found. {_SUMMARY}"
    )


def diagnose_oom(pid: str = "", snapshot_dir: str = "") -> str:
    """Diagnose an out-of-memory error in distributed training (CUDA OOM on one rank, host OOM killer)."""
    target = (
        f" Snapshots are in {snapshot_dir}." if snapshot_dir else (f" The job's pid is {pid}." if pid else "")
    )
    return (
        "A distributed PyTorch job runs out of memory." + target + f" Follow {URI_PREFIX}oom.md.\n"
        "1. inspect_memory on the live job (per-rank GPU and host memory, imbalance) or on memory snapshots "
        "(top allocation sites, peak, fragmentation, leak suspects).\n"
        "2. One rank far above the others: rank-0-only work (evaluation, checkpoint gathering), uneven batches. "
        "All ranks near the limit: the sharding plan cannot fit; check the memory budget (FSDP wrapped only at "
        "the root all-gathers the whole model).\n"
        "3. Reserved much larger than allocated with a large request failing: fragmentation; "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True addresses it. torch.cuda.empty_cache() does not make "
        "more memory available to PyTorch: it only returns cached blocks to the driver.\n"
        f"4. generate_repro when the cause is a code pattern. {_SUMMARY}"
    )


def _register_prompts(server: MCPServer) -> None:
    server.prompt(name="diagnose_hang", title="Diagnose a hung distributed job")(diagnose_hang)
    server.prompt(name="diagnose_crash", title="Diagnose a crash or a killed worker")(diagnose_crash)
    server.prompt(name="diagnose_wrong_results", title="Diagnose different results across ranks")(
        diagnose_wrong_results
    )
    server.prompt(name="diagnose_oom", title="Diagnose out-of-memory in distributed training")(diagnose_oom)


def register(server: MCPServer) -> None:
    _register_resources(server)
    _register_prompts(server)
