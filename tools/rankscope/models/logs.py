"""Answer of `rankscope triage` / MCP `triage_logs`: findings from logs and the rank they blame."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rankscope.models.core import Finding, Model, NextStep, Verdict

SourceKind = Literal[
    "file",
    "stdin",
    "text",
    "error_json",
    "flight_dump",
    "saved_stacks",
    "memory_snapshot",
    "answer",
    "source",
]
"""``file`` a log; ``flight_dump`` a flight-recorder dump; ``saved_stacks`` py-spy or faulthandler
output; ``memory_snapshot`` a CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``); ``answer``
a rankscope answer saved to a file (not read: it is not the job's own output); ``source`` a script named
beside the logs, read for the code a silent rank passes."""
DecidedBy = Literal["logs", "flight_recorder", "stacks", "memory_snapshots", "watch"]


class LogSource(Model):
    """One input that was read (a file, stdin, an error.json)."""

    path: str = Field(description="File path, '-' for stdin, '<text>' for inline text.")
    kind: SourceKind = "file"
    rank_hint: int | None = Field(
        default=None, description="Rank taken from the file name (rank3.log, attempt_0/3/...)."
    )
    lines: int = 0
    bytes: int = 0
    skipped: str | None = Field(
        default=None, description="Why the source was not analysed (binary, unreadable)."
    )


class FailureRecord(Model):
    """One entry of torchrun's ChildFailedError table or of an error.json."""

    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    exitcode: int | None = None
    signal: str | None = None
    time: str | None = None
    error_file: str | None = None
    message: str = ""
    first_observed: bool = Field(
        default=False, description="torchrun's 'Root Cause (first observed failure)'."
    )


class BlockingCall(Model):
    """A call read from the code that can block for good, passed before the collective."""

    line: int
    code: str
    waits_on: str
    via: str | None = None
    """The call of the same file it is reached through (``:53 `x = next_batch(q)```)."""
    later_in_loop: bool = False
    """After the collective in its loop: passed on the way to the next pass's."""


class SilentRanks(Model):
    """Ranks with no traceback while ``waited`` timed out in ``collective`` (file:line in function)."""

    ranks: list[int]
    waited: list[int] = Field(default_factory=list)
    collective: str
    code: str = ""
    calls: list[BlockingCall] = Field(default_factory=list)
    note: str | None = None


class TriageReport(Model):
    """Every recognised event, and the reasoning across them."""

    sources: list[LogSource] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list, description="Most important first.")
    kinds: dict[str, int] = Field(default_factory=dict, description="Number of findings per kind.")
    suspect_ranks: list[int] = Field(
        default_factory=list, description="Ranks most likely to hold the root cause."
    )
    victim_ranks: list[int] = Field(
        default_factory=list,
        description="Ranks that failed because another rank did (closed peer, waited in a collective).",
    )
    seen_ranks: list[int] = Field(default_factory=list, description="Every rank the logs mention.")
    failures: list[FailureRecord] = Field(
        default_factory=list, description="torchrun / error.json failure records."
    )
    summary: str = ""
    decided_by: DecidedBy | None = Field(
        default=None,
        description="Which source decided suspect_ranks when several were read: the flight recorder "
        "outranks saved stacks, which outrank the logs, where they disagree.",
    )
    playbook: str | None = Field(default=None, description="The one skill section to read next.")
    evidence: list[str] = Field(
        default_factory=list, description="The reasons behind suspect_ranks, one per line."
    )
    flight: Verdict | None = Field(
        default=None, description="The flight-recorder dumps' own verdict, when dumps were read."
    )
    stacks: Verdict | None = Field(
        default=None, description="The saved stacks' own verdict, when stack files were read."
    )
    blocking_calls: list[str] | None = None
    watch: list[str] | None = None
    """A watch folder only: what to weigh beside its capture (incomplete, slow phases, hosts gone, attempts)."""
    """Silent ranks only: the blocking calls the code has them pass before the collective."""
    next_steps: list[NextStep] = Field(default_factory=list)
    truncated: bool = Field(
        default=False, description="True when findings beyond max_findings were left out."
    )
    dropped_findings: int = 0
    stats: dict[str, Any] = Field(default_factory=dict, description="Bytes and lines read, seconds spent.")
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )
