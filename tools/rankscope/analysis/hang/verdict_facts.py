"""What the hang rules read (:class:`Facts`, sorted once from one capture) and what they return
(:class:`Ruling`: who is suspect, how sure, and which sentence and steps say so).

The facts sort the ranks by what they wait for, because that is what every rule asks first:
a rank in a collective, in none, waiting for the GPU, stopped. The evidence lines every
verdict carries are written from them by analysis/hang/verdict_evidence.py, which reads this
module (as do the phrases); nothing here reads either, so the three import in one direction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rankscope.analysis.hang.conditions import Guard, stack_guard
from rankscope.analysis.hang.counters import CounterSplit, counter_split
from rankscope.analysis.hang.frames import STUCK_STATES, main_thread
from rankscope.analysis.hang.gpu_busy import idle_minority
from rankscope.analysis.hang.library_calls import LibraryCall, library_call
from rankscope.analysis.hang.locks import LockCycle, lock_cycles
from rankscope.analysis.hang.verdict_texts import Step
from rankscope.analysis.hang.waits import GPU_LIKE
from rankscope.analysis.p2p import P2P_DIRECTION, Waits
from rankscope.models.core import (
    Backend,
    CallSite,
    Confidence,
    Group,
    Job,
    NextStep,
    RankError,
    RankStack,
    VerdictKind,
)
from rankscope.models.flight import FlightReport
from rankscope.models.ras import RasFinding


@dataclass
class Facts:
    """Everything the rules read, computed once from one capture."""

    job: Job
    annotated: list[RankStack]
    groups: list[Group]
    errors: list[RankError]
    missing: list[int]
    exited: list[int]
    backend: Backend | None = None
    flight: FlightReport | None = None
    ras: RasFinding | None = None
    evidence: list[str] = field(default_factory=list)
    live: list[RankStack] = field(default_factory=list)
    stuck: list[RankStack] = field(default_factory=list)
    in_coll: list[RankStack] = field(default_factory=list)
    idle: list[RankStack] = field(default_factory=list)
    gpu: list[RankStack] = field(default_factory=list)
    op_groups: list[Group] = field(default_factory=list)
    none_groups: list[Group] = field(default_factory=list)
    gpu_groups: list[Group] = field(default_factory=list)
    waits: Waits = field(default_factory=dict)
    counters: CounterSplit | None = None
    gpu_idle: tuple[list[int], str] | None = None
    guards: dict[int, tuple[Guard, CallSite]] = field(default_factory=dict)
    source: Mapping[tuple[str, int], str] = field(default_factory=dict)
    """The job's source lines read around the ranks' frames (conditions, loops), by (file, line)."""
    calls: dict[int, LibraryCall] = field(default_factory=dict)
    """Each live rank's library call that is itself a collective (ZeRO's consolidate_state_dict), if any."""
    locks: list[LockCycle] = field(default_factory=list)
    """The lock cycles among the threads of ranks in no collective (a lock-order deadlock), if any."""

    @property
    def nccl(self) -> bool:
        """NCCL semantics apply: the backend says so, or some rank waits for the GPU."""
        return self.backend in ("nccl", "mixed") or bool(self.gpu)

    @property
    def on_gloo(self) -> bool:
        """The job runs gloo only: NCCL's transport and recorder dumps are not its words or its steps."""
        return self.backend == "gloo"


@dataclass(frozen=True)
class Ruling:
    """A rule's answer: the verdict's kind, suspects and confidence, its summary and evidence,
    and its next steps by key (:data:`~rankscope.analysis.hang.verdict_texts.STEPS`; a
    :class:`NextStep` is one passed on from the recorder's answer). Words and call arguments
    are put in when the ruling becomes the verdict, so a tie-break that changes the suspects
    changes whom the calls name too."""

    kind: VerdictKind
    suspects: list[int]
    confidence: Confidence
    summary: str
    evidence: list[str]
    steps: tuple[Step | NextStep, ...] = ()


def sort_ranks(
    job: Job,
    annotated: list[RankStack],
    groups: list[Group],
    errors: list[RankError],
    missing: list[int],
    exited: list[int],
    *,
    backend: Backend | None = None,
    flight: FlightReport | None = None,
    source: Mapping[tuple[str, int], str] | None = None,
    ras: RasFinding | None = None,
) -> Facts:
    """Sort the ranks by what they wait for (the evidence lines are left to verdict.with_evidence)."""
    f = Facts(job, annotated, groups, errors, missing, exited, backend=backend, flight=flight, ras=ras)
    f.source = source or {}
    f.guards = _guards(annotated, f.source)
    f.stuck = [s for s in annotated if s.state in STUCK_STATES and s.rank is not None]
    f.live = [s for s in annotated if s.threads and s.rank is not None and s.state not in STUCK_STATES]
    f.gpu = [s for s in f.live if s.wait in GPU_LIKE]
    f.in_coll = [s for s in f.live if s.op and s.wait not in GPU_LIKE]
    f.idle = [s for s in f.live if not s.op and s.wait not in GPU_LIKE]
    f.gpu_groups = [g for g in groups if g.state is None and g.wait in GPU_LIKE]
    f.op_groups = [g for g in groups if g.state is None and g.op and g.wait not in GPU_LIKE]
    f.none_groups = [g for g in groups if g.state is None and not g.op and g.wait not in GPU_LIKE]
    f.calls = {
        s.rank: call
        for s in f.live
        if s.rank is not None
        and (t := main_thread(s)) is not None
        and (call := library_call(t.frames, f.source))
    }
    f.waits = _p2p_waits(f.live)
    f.locks = lock_cycles(f.idle, f.source)
    f.counters = counter_split(f.live)
    f.gpu_idle = idle_minority(
        {s.rank: s.gpu_util for s in f.live if s.rank is not None and s.gpu_util is not None}
    )
    return f


def _p2p_waits(live: list[RankStack]) -> Waits:
    """rank -> (direction, peer) for every live rank blocked in a send/recv whose peer is known."""
    return {
        s.rank: (P2P_DIRECTION[s.op], s.peer)
        for s in live
        if s.rank is not None and s.op in P2P_DIRECTION and s.peer is not None
    }


def _guards(
    stacks: list[RankStack], source: Mapping[tuple[str, int], str]
) -> dict[int, tuple[Guard, CallSite]]:
    """Each rank's condition above its call (``if rank == 0:``), where the source lines were read;
    a line every rank's stack holds guards no one apart."""
    out: dict[int, tuple[Guard, CallSite]] = {}
    if not source:
        return out
    mains = [(s, main_thread(s)) for s in stacks]
    lines = [{(f.file, f.line) for f in t.frames if f.line is not None} for _, t in mains if t is not None]
    shared = frozenset(set.intersection(*lines)) if len(lines) > 1 else frozenset()
    for s, thread in mains:
        if s.rank is None or thread is None:
            continue
        found = stack_guard(thread.frames, source, shared)
        if found is not None:
            out[s.rank] = found
    return out


__all__ = ["Facts", "Ruling", "sort_ranks"]
