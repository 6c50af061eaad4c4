"""The façade: one function per capability, returning pydantic models.

The CLI and the MCP server call only these. Each name resolves lazily to the
module that implements it, so importing ``rankscope.api`` stays cheap (no
torch, no py-spy run, no mcp) and a capability's dependencies load only when
it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankscope.lazy import lazy_getattr

EXPORTS: dict[str, str] = {
    # hangs (discovery + stacks + launch)
    "list_jobs": "rankscope.discovery",
    "find_job": "rankscope.discovery",
    "dump_stacks": "rankscope.stacks",
    "run_job": "rankscope.launch",
    "run_all_ranks": "rankscope.launch",
    # environment and logs
    "collect_env": "rankscope.envinfo",
    "triage_logs": "rankscope.triage",
    # cross-rank consistency and placements (offline side of rankscope.probe)
    "compare_dir": "rankscope.compare",
    "inspect_placements": "rankscope.placements",
    # minimal repros
    "list_templates": "rankscope.repro",
    "render_repro": "rankscope.repro",
    "repro_from_report": "rankscope.repro",
    "verify_repro": "rankscope.repro",
    # beyond one host / after the fact
    "dump_stacks_remote": "rankscope.remote",
    "analyze_flight_recorder": "rankscope.flight",
    "stacks_from_files": "rankscope.saved_stacks",
    # memory
    "inspect_memory": "rankscope.memory",
    "memory_budget": "rankscope.memory",
    # the skill
    "install_skill": "rankscope.install",
    "mcp_config": "rankscope.install",
    # options and the argument checks both faces share
    "DumpOptions": "rankscope.options",
    "check_pid": "rankscope.validate",
    "check_stacks_call": "rankscope.validate",
}

__all__ = sorted(EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.compare import compare_dir as compare_dir
    from rankscope.discovery import find_job as find_job
    from rankscope.discovery import list_jobs as list_jobs
    from rankscope.envinfo import collect_env as collect_env
    from rankscope.flight import analyze_flight_recorder as analyze_flight_recorder
    from rankscope.install import install_skill as install_skill
    from rankscope.install import mcp_config as mcp_config
    from rankscope.launch import run_all_ranks as run_all_ranks
    from rankscope.launch import run_job as run_job
    from rankscope.memory import inspect_memory as inspect_memory
    from rankscope.memory import memory_budget as memory_budget
    from rankscope.options import DumpOptions as DumpOptions
    from rankscope.placements import inspect_placements as inspect_placements
    from rankscope.remote import dump_stacks_remote as dump_stacks_remote
    from rankscope.repro import list_templates as list_templates
    from rankscope.repro import render_repro as render_repro
    from rankscope.repro import repro_from_report as repro_from_report
    from rankscope.repro import verify_repro as verify_repro
    from rankscope.saved_stacks import stacks_from_files as stacks_from_files
    from rankscope.stacks import dump_stacks as dump_stacks
    from rankscope.triage import triage_logs as triage_logs
    from rankscope.validate import check_pid as check_pid
    from rankscope.validate import check_stacks_call as check_stacks_call


__getattr__ = lazy_getattr(__name__, EXPORTS)
