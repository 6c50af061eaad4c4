"""Pydantic models shared by every layer.

``rankscope.models.core`` holds the ground vocabulary (processes, jobs,
stacks, verdicts, findings). Each capability keeps its own report models in a
sibling module (``models.env``, ``models.logs``, ...), so the CLI's ``--json``,
the MCP server's structured content and the human renderers all share one
model per answer.
"""

from rankscope.models.core import (
    CallSite,
    Finding,
    Frame,
    Group,
    Job,
    JobList,
    LocalVar,
    NextStep,
    RankError,
    RankProcess,
    RankStack,
    Severity,
    StacksReport,
    ThreadStack,
    Verdict,
    VerdictKind,
)

__all__ = [
    "CallSite",
    "Finding",
    "Frame",
    "Group",
    "Job",
    "JobList",
    "LocalVar",
    "NextStep",
    "RankError",
    "RankProcess",
    "RankStack",
    "Severity",
    "StacksReport",
    "ThreadStack",
    "Verdict",
    "VerdictKind",
]
