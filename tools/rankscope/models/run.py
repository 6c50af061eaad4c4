"""Report models of `rankscope run` / MCP `run_all_ranks`.

One ``RunReport`` answers both faces: the CLI renders it (or prints it as
``--json``), the MCP tool returns it as structured content.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.core import Model, NextStep, StacksReport

RunOutcome = Literal["ok", "crashed", "hung", "timeout"]
"""``ok``: exit 0. ``crashed``: non-zero exit. ``hung``: no progress for the hang
timeout (stacks captured, job terminated). ``timeout``: the wall-clock limit passed."""


class CollapsedLine(Model):
    """One line of output and the ranks that printed it at that point.

    ``uniform`` is True when every rank of the job printed exactly this line
    here; lines that only some ranks printed (or that differ between ranks)
    have ``uniform`` False, so they stand out.
    """

    ranks: list[int]
    text: str
    uniform: bool


class RankExit(Model):
    """How one rank ended, as torchrun reported it."""

    rank: int
    local_rank: int | None = None
    exit_code: int | None = Field(
        default=None, description="Exit status; negative for a signal (-9 = SIGKILL)."
    )
    signal: str | None = Field(
        default=None, description="Signal name when the rank was killed by one, e.g. 'SIGSEGV'."
    )
    pid: int | None = None
    root_cause: bool = Field(default=False, description="torchrun's 'Root Cause (first observed failure)'.")
    detail: str | None = Field(
        default=None, description="torchrun's traceback / error line for this rank (redacted)."
    )


class RankOutput(Model):
    """Everything one rank printed (redacted; the oldest lines dropped beyond the cap)."""

    rank: int
    pid: int | None = None
    stdout: list[str] = Field(default_factory=list)
    stderr: list[str] = Field(default_factory=list)
    dropped_lines: int = Field(
        default=0, description="Lines not kept (oldest first) because of the per-rank cap."
    )


class RunReport(Model):
    """Answer of `rankscope run` and MCP `run_all_ranks`."""

    outcome: RunOutcome
    summary: str = Field(description="One sentence: what happened, which ranks.")
    exit_code: int | None = Field(
        default=None, description="torchrun's exit status (None when rankscope stopped it)."
    )
    command: list[str] = Field(default_factory=list, description="The launched command line (redacted).")
    launcher_pid: int | None = Field(
        default=None, description="pid of the torchrun process (gone by the time of the answer)."
    )
    nproc: int
    duration_s: float
    failed_ranks: list[RankExit] = Field(
        default_factory=list, description="Ranks that exited non-zero, first failure first."
    )
    collapsed_stdout: list[CollapsedLine] = Field(
        default_factory=list, description="Ranks' stdout in rank order, identical lines collapsed."
    )
    collapsed_stderr: list[CollapsedLine] = Field(
        default_factory=list, description="Ranks' stderr in rank order, identical lines collapsed."
    )
    ranks: list[RankOutput] = Field(
        default_factory=list, description="Raw per-rank output; may be omitted in bounded answers."
    )
    launcher_output: list[str] = Field(
        default_factory=list,
        description="torchrun's own output (tail, redacted): its errors and failure summary.",
    )
    stacks: StacksReport | None = Field(
        default=None, description="Stacks and verdict captured when the job hung."
    )
    hang_evidence: str | None = Field(
        default=None, description="Why the job was declared hung (quiet time, CPU use)."
    )
    notes: list[str] = Field(default_factory=list)
    truncated: bool = Field(
        default=False, description="True when collapsed output or stacks were cut to bound the answer."
    )
    hint: str | None = Field(default=None, description="How to get what a bounded answer left out.")
    next_steps: list[NextStep] = Field(default_factory=list)
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )
