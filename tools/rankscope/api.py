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
    "list_jobs": "rankscope.capabilities.discovery",
    "find_job": "rankscope.capabilities.discovery",
    "dump_stacks": "rankscope.capabilities.stacks",
    "look_here": "rankscope.capabilities.stacks",
    "run_job": "rankscope.capabilities.launch",
    "run_all_ranks": "rankscope.capabilities.launch",
    # environment and logs
    "collect_env": "rankscope.capabilities.envinfo",
    "triage_logs": "rankscope.capabilities.triage",
    # cross-rank consistency and placements (offline side of rankscope.probe)
    "compare_dir": "rankscope.capabilities.consistency",
    "inspect_placements": "rankscope.capabilities.placements",
    # minimal repros
    "list_templates": "rankscope.capabilities.repro",
    "render_repro": "rankscope.capabilities.repro",
    "repro_from_report": "rankscope.capabilities.repro",
    "verify_repro": "rankscope.capabilities.repro",
    # beyond one host / after the fact
    "dump_stacks_remote": "rankscope.capabilities.remote",
    "live_stacks": "rankscope.capabilities.live_call",
    "slurm_target": "rankscope.capabilities.slurm",
    "analyze_flight_recorder": "rankscope.capabilities.recorder.flight",
    # a watch beside a running job (issue 42): start it, list the watches, read one
    "WatchConfig": "rankscope.capabilities.watch",
    "run_watch": "rankscope.capabilities.watch_start",
    "start_watch": "rankscope.capabilities.watch_start",
    "list_watches": "rankscope.capabilities.watch_start",
    "read_watch": "rankscope.capabilities.watch_start",
    "host_samples": "rankscope.capabilities.watch_stream",
    "stacks_from_files": "rankscope.capabilities.saved_stacks",
    # the last capture again: more of the same answer (--last, last=true)
    "save_capture": "rankscope.capabilities.last_capture",
    "last_capture": "rankscope.capabilities.last_capture",
    "with_whole_suspects": "rankscope.capabilities.last_capture",
    # memory
    "inspect_memory": "rankscope.capabilities.memory",
    "memory_budget": "rankscope.capabilities.memory",
    # the skill
    "install_skill": "rankscope.capabilities.install",
    "mcp_config": "rankscope.capabilities.install",
    # the option types both faces build once, and the argument checks they share
    "DumpOptions": "rankscope.options",
    "StacksTarget": "rankscope.options",
    "check_pid": "rankscope.options",
    "check_stacks_call": "rankscope.validate",
    "check_repro_call": "rankscope.validate",
    # the one redaction every answer passes on its way out (CLI printer, MCP tool wrapper)
    "redact_model": "rankscope.analysis.redact",
    # how every answer leaves (one registry, render.answer.ANSWERS): bounded unless the call asks for
    # all of it, in a person's lines, or in the two forms of an MCP answer (text block, structured content)
    "ANSWER_BOUND": "rankscope.render.answer",
    "answer": "rankscope.render.answer",
    "render_answer": "rankscope.render.answer",
    "shape_answer": "rankscope.render.answer",
    "verdict_label": "rankscope.render.stacks",
    # the bundled skill files (MCP resources) and one section of them at a time
    "read_skill": "rankscope.capabilities.skill",
    "all_sections": "rankscope.capabilities.skill",
    "skill_md": "rankscope.resources",
    "playbooks_dir": "rankscope.resources",
}

__all__ = sorted(EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.analysis.redact import redact_model as redact_model
    from rankscope.capabilities.consistency import compare_dir as compare_dir
    from rankscope.capabilities.discovery import find_job as find_job
    from rankscope.capabilities.discovery import list_jobs as list_jobs
    from rankscope.capabilities.envinfo import collect_env as collect_env
    from rankscope.capabilities.install import install_skill as install_skill
    from rankscope.capabilities.install import mcp_config as mcp_config
    from rankscope.capabilities.last_capture import last_capture as last_capture
    from rankscope.capabilities.last_capture import save_capture as save_capture
    from rankscope.capabilities.last_capture import with_whole_suspects as with_whole_suspects
    from rankscope.capabilities.launch import run_all_ranks as run_all_ranks
    from rankscope.capabilities.launch import run_job as run_job
    from rankscope.capabilities.live_call import live_stacks as live_stacks
    from rankscope.capabilities.memory import inspect_memory as inspect_memory
    from rankscope.capabilities.memory import memory_budget as memory_budget
    from rankscope.capabilities.placements import inspect_placements as inspect_placements
    from rankscope.capabilities.recorder.flight import analyze_flight_recorder as analyze_flight_recorder
    from rankscope.capabilities.remote import dump_stacks_remote as dump_stacks_remote
    from rankscope.capabilities.repro import list_templates as list_templates
    from rankscope.capabilities.repro import render_repro as render_repro
    from rankscope.capabilities.repro import repro_from_report as repro_from_report
    from rankscope.capabilities.repro import verify_repro as verify_repro
    from rankscope.capabilities.saved_stacks import stacks_from_files as stacks_from_files
    from rankscope.capabilities.skill import all_sections as all_sections
    from rankscope.capabilities.skill import read_skill as read_skill
    from rankscope.capabilities.slurm import slurm_target as slurm_target
    from rankscope.capabilities.stacks import dump_stacks as dump_stacks
    from rankscope.capabilities.stacks import look_here as look_here
    from rankscope.capabilities.triage import triage_logs as triage_logs
    from rankscope.capabilities.watch import WatchConfig as WatchConfig
    from rankscope.capabilities.watch_start import list_watches as list_watches
    from rankscope.capabilities.watch_start import read_watch as read_watch
    from rankscope.capabilities.watch_start import run_watch as run_watch
    from rankscope.capabilities.watch_start import start_watch as start_watch
    from rankscope.capabilities.watch_stream import host_samples as host_samples
    from rankscope.options import DumpOptions as DumpOptions
    from rankscope.options import StacksTarget as StacksTarget
    from rankscope.options import check_pid as check_pid
    from rankscope.render.answer import ANSWER_BOUND as ANSWER_BOUND
    from rankscope.render.answer import answer as answer
    from rankscope.render.answer import render_answer as render_answer
    from rankscope.render.answer import shape_answer as shape_answer
    from rankscope.render.stacks import verdict_label as verdict_label
    from rankscope.resources import playbooks_dir as playbooks_dir
    from rankscope.resources import skill_md as skill_md
    from rankscope.validate import check_repro_call as check_repro_call
    from rankscope.validate import check_stacks_call as check_stacks_call


__getattr__ = lazy_getattr(__name__, EXPORTS)
