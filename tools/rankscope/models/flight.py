"""Answer of `rankscope fr` / MCP `analyze_flight_recorder`.

A flight-recorder dump is one rank's ring buffer of its last collectives. The
report aligns the ranks' entries per process group by sequence id and names the
first collective where they disagree, in the same ``Verdict`` shape as stacks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.core import CallSite, Frame, Model, RankError, Verdict

MismatchKind = Literal[
    "not_entered",  # some ranks never recorded this collective while others did
    "op_mismatch",  # different collective types at the same sequence id
    "size_mismatch",  # same op, different input/output sizes
    "dtype_mismatch",  # same op, different dtypes
    "p2p_unmatched",  # a send/recv whose peer has nothing pending: it never posted the other side
    "p2p_wrong_peer",  # a send/recv whose peer waits in something else (another peer, a collective)
    "p2p_deadlock",  # sends/recvs that wait on each other in a cycle with no matching pair
]


class FrDump(Model):
    """One dump file that was read."""

    path: str
    rank: int
    format: Literal["pickle", "json"]
    version: str = ""
    entries: int = 0
    process_groups: list[str] = Field(default_factory=list)
    repaired: list[str] = Field(
        default_factory=list, description="What was fixed to read it (e.g. Gloo's pg_config)."
    )


class FrEntry(Model):
    """One rank's record of one collective (or p2p op), trimmed to what a diagnosis needs."""

    rank: int
    process_group: str
    pg_desc: str = ""
    seq_id: int
    is_p2p: bool = False
    op: str = Field(description="profiling_name, e.g. 'nccl:all_reduce' or 'gloo:broadcast'.")
    input_sizes: list[list[int]] = Field(default_factory=list)
    output_sizes: list[list[int]] = Field(default_factory=list)
    input_dtypes: list[str] = Field(default_factory=list)
    output_dtypes: list[str] = Field(default_factory=list)
    state: str = ""
    completed: bool = False
    time_created_ns: int | None = None
    timeout_ms: int | None = None
    call_site: CallSite | None = Field(default=None, description="Innermost recorded frame outside torch.")
    frames: list[Frame] = Field(default_factory=list, description="Recorded Python stack, innermost first.")


class FrMismatch(Model):
    """The first sequence id of a process group at which the ranks disagree."""

    process_group: str
    pg_desc: str = ""
    seq_id: int
    is_p2p: bool = False
    kind: MismatchKind
    ranks_entered: list[int] = Field(default_factory=list)
    ranks_not_entered: list[int] = Field(default_factory=list)
    suspect_ranks: list[int] = Field(default_factory=list)
    description: str
    torchfrtrace: str | None = Field(
        default=None, description="torchfrtrace's own MatchState for the pair, when it could judge."
    )
    entries: list[FrEntry] = Field(default_factory=list, description="Each rank's entry at this sequence id.")


class FrRankProgress(Model):
    """How far one rank got in one process group."""

    rank: int
    process_group: str
    last_entered: int | None = None
    last_completed: int | None = None
    pending_op: str | None = Field(
        default=None, description="The oldest collective this rank entered but did not finish."
    )
    pending_p2p: str | None = Field(
        default=None,
        description="The oldest send/recv this rank posted but did not finish, e.g. 'nccl:recv 1<-0 #3'.",
    )


class FrProcessGroup(Model):
    """One process group across the dumps."""

    name: str
    desc: str = ""
    ranks: list[int] = Field(
        default_factory=list, description="Member ranks (from pg_config, or the dumps that mention it)."
    )
    ranks_with_dumps: list[int] = Field(default_factory=list)
    aligned_from: int | None = Field(
        default=None, description="First sequence id present in every dump (ring buffers forget)."
    )
    aligned_to: int | None = None
    progress: list[FrRankProgress] = Field(default_factory=list)
    first_mismatch: FrMismatch | None = None
    p2p_mismatch: FrMismatch | None = Field(
        default=None,
        description="Pending sends/recvs whose other side was never posted (p2p_seq_id counts per rank, so "
        "they are matched by peer, not by number).",
    )


class FlightReport(Model):
    """Everything `rankscope fr` concluded from a set of flight-recorder dumps."""

    dumps: list[FrDump] = Field(default_factory=list)
    dumps_read: int | None = Field(
        default=None, description="Dump files read, when a bounded answer lists fewer of them in `dumps`."
    )
    world_size: int | None = None
    ranks: list[int] = Field(default_factory=list, description="Ranks with a readable dump.")
    missing_ranks: list[int] = Field(
        default_factory=list, description="Ranks of the world without a readable dump."
    )
    process_groups: list[FrProcessGroup] = Field(default_factory=list)
    first_mismatch: FrMismatch | None = None
    verdict: Verdict
    stacks_verdict: Verdict | None = Field(
        default=None, description="The live stacks report's verdict, when one was merged."
    )
    errors: list[RankError] = Field(
        default_factory=list, description="Files that could not be read; the others are analysed."
    )
    notes: list[str] = Field(default_factory=list)
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )
