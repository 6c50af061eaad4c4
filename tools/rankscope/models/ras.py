"""What NCCL's RAS service said of a job's communicators (``rankscope stacks --ras``).

NCCL >= 2.24 runs a RAS thread in every NCCL process; one per node listens on
``localhost:28028`` (``NCCL_RAS_ADDR``) and answers ``STATUS`` with every communicator's
ranks, their per-collective launch counts and the ranks it cannot reach. Launch counts are
counted on the host when a collective is enqueued, so a rank that never called the
collective the others wait in is behind by one or more, long before any timeout.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.core import Confidence, Model


class RasRank(Model):
    """One rank of a communicator, as RAS reported it."""

    comm_rank: int
    host: str = ""
    pid: int | None = None
    launched: int = Field(description="Collectives launched on this communicator, all types together.")
    by_op: dict[str, int] = Field(
        default_factory=dict, description="Launch count per collective type (nonzero)."
    )
    error: str | None = Field(
        default=None, description="Init/async error or abort flag RAS reported, if any."
    )


class RasMissing(Model):
    """A rank of a communicator RAS got no data from."""

    comm_rank: int
    host: str = ""
    pid: int | None = None
    dead: bool = Field(default=False, description="RAS considers the process dead (unreachable for 60 s).")


class RasComm(Model):
    """One NCCL communicator."""

    hash: str
    size: int
    ranks: list[RasRank] = Field(default_factory=list)
    missing: list[RasMissing] = Field(default_factory=list)
    counts: dict[int, int] = Field(
        default_factory=dict,
        description="Launch count -> number of ranks at it, when the answer gave only the tally (text format).",
    )


class RasStatus(Model):
    """One ``STATUS`` answer, parsed."""

    format: Literal["json", "text"]
    nccl_version: str | None = None
    communicators: list[RasComm] = Field(default_factory=list)
    incomplete: bool = Field(default=False, description="RAS timed out on some peers: the data is partial.")


class RasFinding(Model):
    """What the launch counts say: the ranks behind (or ahead), or the ranks RAS lost."""

    kind: Literal["off_count", "lost", "agree"] = Field(
        description="off_count: some ranks launched more or fewer collectives than the rest; lost: RAS cannot "
        "reach some ranks; agree: every rank launched the same collectives."
    )
    suspect_ranks: list[int] = Field(
        default_factory=list, description="Global ranks, where they could be mapped."
    )
    confidence: Confidence = "low"
    summary: str
    evidence: list[str] = Field(default_factory=list)
    progressing: bool | None = Field(
        default=None, description="Whether launch counts moved between the two reads; None after one read."
    )


__all__ = ["RasComm", "RasFinding", "RasMissing", "RasRank", "RasStatus"]
