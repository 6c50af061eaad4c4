"""The hang verdict: a table of rules, read one at a time, first match wins.

Each rule takes the facts of one capture (:class:`Facts`) and returns a verdict or None.
The gloo rules assume what gloo does: a collective blocks the CPU until every rank
arrives, so where the CPU stops is where the rank is stuck. The NCCL rules know that a
collective returns once its kernel is enqueued: a rank waiting for the GPU (``wait`` =
gpu, launch_queue, allocator) is queued behind a stuck kernel and is never "the rank that
did not reach the collective"; progress counters, ranks in CPU-blocking collectives, a
rank that waits for nothing GPU-side, and the flight recorder decide instead, and when
none does the verdict says the CPU side cannot tell.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rankscope.analysis.conditions import Guard, stack_guard
from rankscope.analysis.counters import CounterSplit, counter_split
from rankscope.analysis.frames import (
    GONE_STATES,
    STUCK_STATES,
    blocked_in,
    is_user_frame,
    lib_where,
    main_thread,
    parting,
    short_site,
)
from rankscope.analysis.gpu_busy import idle_minority
from rankscope.analysis.group_members import members as group_members
from rankscope.analysis.p2p import P2P_DIRECTION, Waits, cycle_phrase, find_cycle, is_matched, verb
from rankscope.analysis.ranges import ranks_phrase
from rankscope.analysis.waits import GPU_LIKE, under_own_line, wait_phrase
from rankscope.models.core import (
    Backend,
    CallSite,
    Confidence,
    Group,
    Job,
    NextStep,
    RankError,
    RankStack,
    Verdict,
)
from rankscope.models.flight import FlightReport
from rankscope.models.ras import RasFinding

_PLAYBOOK = "skill/hangs.md"
BACKWARD_OP = "autograd.backward"


def _describe(group: Group, verb: str = "wait") -> str:
    who = ranks_phrase(group.ranks)
    plural = len(group.ranks) > 1
    if group.wait in GPU_LIKE:
        what = wait_phrase(group.wait or "")
        if not plural:
            what = what.replace("wait ", "waits ", 1).replace("are ", "is ", 1)
        inside = f" (inside {group.op})" if group.op else ""
        return f"{who} {what} at {short_site(group.call_site)}{inside}"
    if group.op:
        return f"{who} {verb if plural else verb + 's'} in {group.op} at {short_site(group.call_site)}"
    be = "are" if plural else "is"
    inner = blocked_in(group.frames)
    return f"{who} {be} in no collective, at {short_site(group.call_site)}" + (
        f" blocked in {inner}" if inner else ""
    )


_STATE_WORDS: dict[str, str] = {
    "stopped": "stopped (state T: SIGSTOP, Ctrl-Z or a debugger)",
    "tracing_stop": "stopped by a tracer (state t: a debugger is attached)",
    "disk_sleep": "in uninterruptible sleep (state D: stuck in the kernel, often I/O or a driver)",
    "zombie": "a zombie (exited, not yet reaped)",
    "dead": "dead",
}


# -- point-to-point ----------------------------------------------------------------------------


MAX_P2P_LINES = 8
"""Evidence lines about send/recv peers at most: an answer for 256 ranks stays short."""


def _p2p_waits(live: list[RankStack]) -> Waits:
    """rank -> (direction, peer) for every live rank blocked in a send/recv whose peer is known."""
    return {
        s.rank: (P2P_DIRECTION[s.op], s.peer)
        for s in live
        if s.rank is not None and s.op in P2P_DIRECTION and s.peer is not None
    }


def _p2p_lines(waits: Waits, all_stacks: list[RankStack]) -> list[str]:
    """Evidence: for each rank in a send/recv with a known peer, what that peer is doing."""
    by_rank = {s.rank: s for s in all_stacks if s.rank is not None}
    lines: list[str] = []
    for rank, (direction, peer) in sorted(waits.items()):
        other = by_rank.get(peer)
        if other is None:
            doing = "which was not captured"
        elif other.state in STUCK_STATES or other.state in GONE_STATES:
            doing = f"which is {_STATE_WORDS.get(other.state, other.state)}"
        elif peer in waits:
            o_dir, o_peer = waits[peer]
            pair = " (a matching pair)" if is_matched(rank, waits) else ""
            doing = f"which {verb(o_dir)} rank {o_peer}{pair}"
        elif other.op:
            doing = f"which waits in {other.op} at {short_site(other.call_site)}"
        elif other.threads:
            doing = f"which is in no collective, at {short_site(other.call_site)}"
        else:
            doing = "whose stack was not captured"
        lines.append(f"rank {rank} {verb(direction)} rank {peer}, {doing}")
    if len(lines) > MAX_P2P_LINES:
        more = len(lines) - MAX_P2P_LINES + 1
        lines = [
            *lines[: MAX_P2P_LINES - 1],
            f"... {more} more ranks in send/recv (each rank's `peer` in `stacks`)",
        ]
    return lines


def _step(action: str, tool: str | None, section: str) -> NextStep:
    return NextStep(action=action, tool=tool, skill_section=f"{_PLAYBOOK}#{section}")


def _on_gloo(backend: Backend | None) -> bool:
    """The job runs gloo only: NCCL's transport and recorder dumps are not its words or its steps."""
    return backend == "gloo"


def _transport(backend: Backend | None) -> str:
    """The transport a stuck collective may wait on, named for this job's backend."""
    if backend in ("nccl", "gloo"):
        return f"the network or the {'NCCL' if backend == 'nccl' else 'Gloo'} transport"
    return "the network or the backend's transport (NCCL or Gloo)"


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

    @property
    def nccl(self) -> bool:
        """NCCL semantics apply: the backend says so, or some rank waits for the GPU."""
        return self.backend in ("nccl", "mixed") or bool(self.gpu)


def facts(
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
    """Sort the ranks by what they wait for and write the evidence every verdict carries."""
    f = Facts(job, annotated, groups, errors, missing, exited, backend=backend, flight=flight, ras=ras)
    f.guards = _guards(annotated, source or {})
    f.stuck = [s for s in annotated if s.state in STUCK_STATES and s.rank is not None]
    f.live = [s for s in annotated if s.threads and s.rank is not None and s.state not in STUCK_STATES]
    f.gpu = [s for s in f.live if s.wait in GPU_LIKE]
    f.in_coll = [s for s in f.live if s.op and s.wait not in GPU_LIKE]
    f.idle = [s for s in f.live if not s.op and s.wait not in GPU_LIKE]
    f.gpu_groups = [g for g in groups if g.state is None and g.wait in GPU_LIKE]
    f.op_groups = [g for g in groups if g.state is None and g.op and g.wait not in GPU_LIKE]
    f.none_groups = [g for g in groups if g.state is None and not g.op and g.wait not in GPU_LIKE]
    f.waits = _p2p_waits(f.live)
    f.counters = counter_split(f.live)
    f.gpu_idle = idle_minority(
        {s.rank: s.gpu_util for s in f.live if s.rank is not None and s.gpu_util is not None}
    )
    f.evidence = _evidence(f)
    return f


def _guards(
    stacks: list[RankStack], source: Mapping[tuple[str, int], str]
) -> dict[int, tuple[Guard, CallSite]]:
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


RAN_OUT_EARLY = "issued fewer collectives there earlier"
"""The words of :func:`parting_phrase` for a suspect past the others' block; the repro chooser
(analysis/templates.py) reads a verdict for them."""


def parting_phrase(f: Facts, suspects: Group, majority: Group) -> tuple[str, bool] | None:
    """``rank 1 leaves ranks 0,2-3 in Trainer.fit (trainer.py): at line 68, they at line 67 ...``, and
    whether it says more than the call sites do (library code, or a suspect past the others' line)."""
    by_rank = {s.rank: s for s in f.annotated}
    a, b = by_rank.get(suspects.ranks[0]), by_rank.get(majority.ranks[0])
    ta, tb = (main_thread(a) if a else None), (main_thread(b) if b else None)
    if ta is None or tb is None:
        return None
    found = parting(ta.frames, tb.frames)
    if found is None:
        return None
    fa, fb = found
    who, they = ranks_phrase(suspects.ranks), ranks_phrase(majority.ranks)
    where = f"{fa.function} ({lib_where(fa).rsplit(':', 1)[0]})"
    library = not is_user_frame(fa)
    if fa.line == fb.line:
        return f"{who} and {they} part below {where} line {fa.line}", library
    text = f"{who} leave{'s' if len(suspects.ranks) == 1 else ''} {they} in {where}: at line {fa.line}, they at line {fb.line}"
    later = fa.line is not None and fb.line is not None and fa.line > fb.line
    if later:
        text += (
            f" (later in the same function: {who} got past the block the others are still in, so it most likely "
            f"{RAN_OUT_EARLY}: a skipped batch, an early continue or return; read that block, not only where it "
            "waits)"
        )
    return text, library or later


def guard_phrase(f: Facts, group: Group) -> str | None:
    """``train.py:9 `if dist.get_rank() == 0:` guards the barrier at train.py:10`` for a group's lead rank."""
    found = f.guards.get(group.ranks[0]) if group.ranks else None
    if found is None:
        return None
    guard, site = found
    what = group.op or "call"
    return guard.phrase(os.path.basename(site.file), what, site.line)


def _evidence(f: Facts) -> list[str]:
    evidence: list[str] = []
    by_rank = {s.rank: s for s in f.annotated}
    for g in f.groups:
        if g.state is not None:
            evidence.append(f"{ranks_phrase(g.ranks)}: process {_STATE_WORDS.get(g.state, g.state)}")
            continue
        lead = by_rank.get(g.ranks[0])
        why = (
            lead.wait_evidence
            if lead is not None and g.wait in GPU_LIKE
            else (lead.op_evidence if lead else None)
        )
        evidence.append(_describe(g) + (f" [{why}]" if why else ""))
    seen_guards: set[str] = set()
    for g in f.groups:
        phrase = guard_phrase(f, g) if g.state is None else None
        if phrase and phrase not in seen_guards:
            seen_guards.add(phrase)
            evidence.append(f"{ranks_phrase(g.ranks)}: {phrase}")
    for e in f.errors:
        who = (
            f"rank {e.rank} (pid {e.pid})"
            if e.rank is not None
            else (f"host {e.host}" if e.host else f"pid {e.pid}")
        )
        evidence.append(f"{who}: capture failed: {e.kind}: {e.message}")
    if f.missing:
        evidence.append(
            f"{ranks_phrase(f.missing)} of world size {f.job.world_size} not found on "
            f"{', '.join(f.job.hosts) or 'this host'}"
        )
    if f.exited:
        evidence.append(f"{ranks_phrase(f.exited)} exited")
    if f.counters is not None:
        evidence.append(f.counters.evidence)
    if f.gpu_idle is not None:
        evidence.append(f.gpu_idle[1])
    evidence.extend(_p2p_lines(f.waits, f.annotated))
    if any(s.op == BACKWARD_OP for s in f.live):
        evidence.append(
            "some ranks are inside autograd backward with no communication frame visible; if the model is wrapped "
            "in DDP they wait for the gradient all-reduce (confirm with --native)"
        )
    if f.gpu:
        evidence.append(
            f"{ranks_phrase(sorted(s.rank for s in f.gpu if s.rank is not None))}: the CPU waits for the GPU; on "
            "NCCL a collective returns once enqueued, so where these CPUs stop is not where the GPU is stuck"
        )
    return evidence


# -- the rules ------------------------------------------------------------------------------------


def rule_nothing_captured(f: Facts) -> Verdict | None:
    """No stack at all: say why and what to fix, name no one."""
    if f.live or f.stuck:
        return None
    return Verdict(
        kind="inconclusive",
        confidence="low",
        summary="no rank's stack could be captured"
        + (f" ({len(f.errors)} capture error(s): {f.errors[0].kind})" if f.errors else ""),
        evidence=f.evidence,
        next_steps=[
            _step(
                "Fix the capture errors listed in `errors` and run dump_stacks again.",
                "dump_stacks",
                "inconclusive",
            ),
            _step("Check that the job is still alive and which ranks run here.", "list_jobs", "inconclusive"),
            _step("If the job already died, read its logs.", "triage_logs", "inconclusive"),
        ],
    )


def rule_flight_recorder(f: Facts) -> Verdict | None:
    """On NCCL the recorder's sequence numbers outrank CPU positions: its suspects decide."""
    if f.flight is None or not f.flight.verdict.suspect_ranks or not f.nccl:
        return None
    fr = f.flight.verdict
    return Verdict(
        kind="mismatched_collectives" if f.flight.first_mismatch is not None else "divergent_ranks",
        suspect_ranks=list(fr.suspect_ranks),
        confidence="high",
        summary=f"flight recorder: {fr.summary}; the CPU stacks show only where each rank waits for the GPU",
        evidence=[f"flight recorder: {line}" for line in fr.evidence[:6]] + f.evidence,
        next_steps=list(fr.next_steps)[:3],
    )


def rule_ras(f: Facts) -> Verdict | None:
    """On NCCL, RAS's launch counts (read only with --ras) outrank CPU positions: a rank off the
    others' count, or one RAS lost, decides; every rank at the same count that did not move says
    the collective was enqueued everywhere, so the hang is below Python."""
    if f.ras is None or not f.nccl:
        return None
    r = f.ras
    evidence = [*r.evidence, *f.evidence]
    if r.kind == "agree":
        if r.progressing:
            return None  # the job moves: the stacks and counters say more
        return Verdict(
            kind="all_in_same_collective",
            confidence="medium",
            summary=f"{r.summary}; look at the network, NCCL and the GPUs, not at the ranks' code",
            evidence=evidence,
            next_steps=[
                _step(
                    "Read the flight recorder: the collective every rank enqueued and none completed, and its group.",
                    "analyze_flight_recorder",
                    "nccl-hangs",
                ),
                _step("Collect NCCL and network settings of every rank.", "collect_env", "nccl-hangs"),
                _step(
                    "Read the logs for NCCL WARN lines, Xid errors and watchdog timeouts.",
                    "triage_logs",
                    "nccl-hangs",
                ),
            ],
        )
    if not r.suspect_ranks:
        return None
    return Verdict(
        kind="missing_ranks" if r.kind == "lost" else "divergent_ranks",
        suspect_ranks=list(r.suspect_ranks),
        confidence=r.confidence,
        summary=f"{r.summary}; the CPU stacks show only where each rank waits for the GPU",
        evidence=evidence,
        next_steps=[
            _step(
                "Dump the suspects' stacks with native frames and locals: what they do instead of launching.",
                "dump_stacks",
                "nccl-hangs",
            ),
            _step(
                "Confirm with the flight recorder which collective the suspects never enqueued.",
                "analyze_flight_recorder",
                "nccl-hangs",
            ),
        ],
    )


def rule_counters(f: Facts) -> Verdict | None:
    """A rank whose progress counter (step, epoch, i) differs from the majority's left the common path.

    Only a clear split decides here: a known counter name, one odd value, a minority. Other
    integers that disagree (a batch's token count) may differ by design; they go in the
    evidence and break the ties the CPU positions leave open (:func:`_tie_break`).
    """
    split = f.counters
    if split is None or not split.suspects or split.confidence != "high":
        return None  # a weaker split (an unnamed integer, several odd values) only breaks ties
    gpu_note = (
        "; the ranks that wait for the GPU are queued behind the collective the suspects never issued"
        if f.gpu
        else ""
    )
    return Verdict(
        kind="divergent_ranks",
        suspect_ranks=split.suspects,
        confidence=split.confidence,
        summary=f"{split.summary}: {ranks_phrase(split.suspects)} left the common path (a skipped or extra step, "
        f"an uneven number of batches, or a rank-dependent branch){gpu_note}",
        evidence=f.evidence,
        next_steps=[
            _step(
                "Read the loop at the counter's frame: what lets the suspects run more (or fewer) iterations "
                "(uneven data shards, a rank-dependent `continue`/`break`, a caught exception).",
                None,
                "progress-counters",
            ),
            _step("Dump again with native frames for the suspects.", "dump_stacks", "progress-counters"),
            _step(
                "Reduce it to a minimal repro once the cause is known.", "generate_repro", "divergent-ranks"
            ),
        ],
    )


def rule_nccl_rank_elsewhere(f: Facts) -> Verdict | None:
    """NCCL: peers wait for the GPU (or in a collective) while some ranks wait for neither: those are the suspects."""
    if not f.nccl or not f.gpu or not (f.idle or f.stuck):
        return None
    suspects = sorted({s.rank for s in [*f.idle, *f.stuck] if s.rank is not None})
    # Python frames alone cannot show a kernel launch blocked under a Python call, nor a GPU wait
    # without a tell-tale line: the suspects' "other" and the peers' "gpu" are then less sure
    inferred = any("inferred" in (s.wait_evidence or "") for s in f.gpu) or any(
        "Python frames only" in (s.wait_evidence or "") for s in f.idle
    )
    parts = [_describe(g) for g in f.none_groups] + [
        f"{ranks_phrase(g.ranks)} {'are' if len(g.ranks) > 1 else 'is'} {_STATE_WORDS.get(g.state or '', g.state)}"
        for g in f.groups
        if g.state in STUCK_STATES
    ]
    waiting = "; ".join(_describe(g) for g in [*f.gpu_groups, *f.op_groups])
    return Verdict(
        kind="divergent_ranks",
        suspect_ranks=suspects,
        confidence="medium" if inferred else "high",
        summary=f"{'; '.join(parts)} while {waiting}: on NCCL the waiting ranks are queued behind a collective "
        f"that {ranks_phrase(suspects)} never issued; the suspects' own stack shows what they do instead",
        evidence=f.evidence,
        next_steps=[
            _step(
                "Read the suspects' stack: a DataLoader worker, a lock, I/O, a checkpoint save or an evaluation loop "
                "that only they run.",
                None,
                "nccl-hangs",
            ),
            _step("Confirm with native frames (GPU waits vs compute).", "dump_stacks", "nccl-hangs"),
            _step(
                "Read the flight recorder dumps: the laggard's last enqueued collective is below the others'.",
                "analyze_flight_recorder",
                "nccl-hangs",
            ),
        ],
    )


def rule_gpu_idle(f: Facts) -> Verdict | None:
    """NCCL: most GPUs spin in a stuck kernel while a few idle: their ranks never launched it."""
    if f.gpu_idle is None or not f.nccl:
        return None
    idle, text = f.gpu_idle
    return Verdict(
        kind="divergent_ranks",
        suspect_ranks=idle,
        confidence="medium",
        summary=f"{text}: on NCCL the spinning GPUs wait in a collective that {ranks_phrase(idle)} never launched",
        evidence=f.evidence,
        next_steps=[
            _step(
                "Dump the suspects with native frames: what their CPU does instead of launching the collective.",
                "dump_stacks",
                "nccl-hangs",
            ),
            _step(
                "Read the flight recorder dumps: the suspects' last enqueued collective is below the others'.",
                "analyze_flight_recorder",
                "nccl-hangs",
            ),
        ],
    )


def rule_nccl_lone_collective(f: Facts) -> Verdict | None:
    """NCCL: a few ranks inside one collective no other rank is in, while the others ran on past it.

    Under NCCL a collective returns once enqueued, so the others went on into their next forward
    pass and now wait for the GPU (or to launch a kernel), queued behind a collective of theirs
    that the few never issued. The few issued a collective the others did not (an object
    collective or a barrier in an evaluation branch, say): they are the suspects. A rank merely
    blocked launching a kernel is not counted as "inside" a collective: any launch blocks there
    once the GPU is stuck.
    """
    if not f.nccl or f.idle or f.stuck:
        return None
    inside = [s for s in f.live if s.op and s.wait != "launch_queue"]
    past = [s for s in f.live if not s.op and s.wait in GPU_LIKE]
    if not inside or not past or len(inside) + len(past) != len(f.live) or len(inside) >= len(past):
        return None
    ops = {s.op for s in inside}
    if len(ops) != 1 or next(iter(ops)) in P2P_DIRECTION:
        return None
    op = next(iter(ops))
    suspects = sorted(s.rank for s in inside if s.rank is not None)
    sites = sorted({short_site(s.call_site) for s in inside})
    others = "; ".join(_describe(g) for g in f.gpu_groups if not g.op)
    # a wait inferred from an unread line (maybe_gpu) may be something else: then only a lead
    unsure = any(s.wait == "maybe_gpu" for s in past)
    return Verdict(
        kind="mismatched_collectives",
        suspect_ranks=suspects,
        confidence="low" if unsure else "medium",
        summary=f"{ranks_phrase(suspects)} {'is' if len(suspects) == 1 else 'are'} inside {op} at {', '.join(sites)}, "
        f"which no other rank is in, while {others}: on NCCL the others ran on past their last collective and are "
        f"queued behind one that {ranks_phrase(suspects)} never issued; {ranks_phrase(suspects)} issued a "
        f"collective the others did not" + _lone_story(f, op),
        evidence=f.evidence,
        next_steps=[
            _step(
                f"Read the suspects' call site: a {op} under a rank- or data-dependent branch (evaluation, logging, "
                "checkpointing) that the other ranks skip. Call it on every rank, or not at all.",
                None,
                "mismatched-collectives",
            ),
            _step(
                "Confirm with the flight recorder: the suspects' last entry is that collective, the others' is "
                "another one at the same sequence number.",
                "analyze_flight_recorder",
                "nccl-hangs",
            ),
        ],
    )


def _lone_story(f: Facts, op: str | None) -> str:
    """Why the lone ranks are elsewhere, as the gloo rule tells it: a rank condition above their
    collective, or where their stack leaves the others' (past the others' line in the same
    function: they ran out of the loop early, one collective short)."""
    lone = next((g for g in f.groups if g.op == op and g.state is None), None)
    if lone is None or not f.gpu_groups:
        return ""
    guard = guard_phrase(f, lone)
    if guard:
        return f"; {guard}"
    majority = max(f.gpu_groups, key=lambda g: len(g.ranks))
    parting = parting_phrase(f, lone, majority)
    return f"; {parting[0]}" if parting is not None and parting[1] else ""


def rule_divergent(f: Facts) -> Verdict | None:
    """Ranks in no collective (or stopped) while their peers wait in one: they never reached it."""
    if not (f.in_coll and (f.idle or f.stuck)):
        return None
    suspects = sorted({s.rank for s in [*f.idle, *f.stuck] if s.rank is not None})
    parts = [
        f"{ranks_phrase(g.ranks)} {'are' if len(g.ranks) > 1 else 'is'} {_STATE_WORDS[g.state]}"
        for g in f.groups
        if g.state in STUCK_STATES
    ]
    parts.extend(_describe(g) for g in f.none_groups)
    waiting = "; ".join(_describe(g) for g in f.op_groups)
    summary = f"{'; '.join(parts)} while {waiting}: {ranks_phrase(suspects)} never reached the collective the others wait in"
    conditions = [p for g in f.none_groups if (p := guard_phrase(f, g))]
    if conditions:
        summary += f"; {'; '.join(conditions)}"
    if f.gpu:
        summary += f" ({_describe_many(f.gpu_groups)}: their CPU position is not where they are stuck)"
    steps = []
    if f.stuck:
        steps.append(
            _step(
                f"Find out why {ranks_phrase([s.rank for s in f.stuck if s.rank is not None])} is not running "
                "(SIGCONT a stopped process, detach a debugger, check the kernel/driver for D state).",
                None,
                "stopped-ranks",
            )
        )
    if f.idle:
        steps.append(
            _step(
                "Read the suspects' call sites: a rank-dependent branch, an early exit from the loop, an exception "
                "caught and swallowed, or a blocking wait (queue, lock, I/O) that only some ranks reach.",
                None,
                "divergent-ranks",
            )
        )
        steps.append(
            _step(
                "Dump again with native frames and locals for the suspects to see what they wait on.",
                "dump_stacks",
                "divergent-ranks",
            )
        )
    steps.append(
        _step("Reduce it to a minimal repro once the cause is known.", "generate_repro", "divergent-ranks")
    )
    confidence: Confidence = "high" if f.stuck or not f.nccl else "medium"
    unread = _in_c_under_own_line(f, suspects)
    if unread:
        confidence = "medium"
        summary += (
            f"; the backend is not known and {ranks_phrase(unread)} {'are' if len(unread) > 1 else 'is'} in C code "
            "called from the job's own line: if this job runs NCCL that may be a wait for the GPU instead "
            "(backend=nccl, native frames or the line itself decide)"
        )
    return Verdict(
        kind="divergent_ranks",
        suspect_ranks=suspects,
        confidence=confidence,
        summary=summary,
        evidence=f.evidence,
        next_steps=steps,
    )


def _in_c_under_own_line(f: Facts, ranks: list[int]) -> list[int]:
    """Of ``ranks``, those read from Python frames alone whose innermost frame is the job's own line
    (so they are in C code called from it), when the backend is not known: on NCCL such a rank may
    be waiting for the GPU rather than be where it is stuck."""
    if f.backend not in (None, "unknown"):
        return []
    return sorted(
        s.rank
        for s in f.live
        if s.rank in ranks
        and s.wait == "other"
        and (thread := main_thread(s)) is not None
        and under_own_line(thread.frames) is not None
    )


def rule_mismatched(f: Facts) -> Verdict | None:
    """Ranks blocked (on the CPU) in different collectives: the minority issued another one."""
    if len(f.op_groups) <= 1:
        return None
    sizes = Counter(len(g.ranks) for g in f.op_groups)
    largest = max(len(g.ranks) for g in f.op_groups)
    if sizes[largest] == 1:
        majority = next(g for g in f.op_groups if len(g.ranks) == largest)
        minority = [g for g in f.op_groups if g is not majority]
        left = _left_in_subgroup(f, majority, minority)
        if left is not None:
            return left
        suspects = sorted(r for g in minority for r in g.ranks)
        confidence = "high"
        summary = (
            f"{'; '.join(_describe(g) for g in minority)} while {_describe(majority)}: "
            f"{ranks_phrase(suspects)} {'are' if len(suspects) > 1 else 'is'} in a different collective than the "
            "others (a collective skipped, added or reordered on those ranks)"
        )
        conditions = [p for g in f.op_groups if (p := guard_phrase(f, g))]
        if conditions:
            summary += f"; {'; '.join(conditions)}"
        partings = [q for g in minority if (q := parting_phrase(f, g, majority))]
        # a rank condition above the suspects' own collective already tells why they are elsewhere
        guarded = any(guard_phrase(f, g) for g in minority)
        told = [text for text, telling in partings if telling and not guarded]
        if told:
            summary += f"; {'; '.join(told)}"
        # guarded: the condition is the story, and a parting's guess (a skipped batch) would contradict it
        extra = [] if guarded else [text for text, telling in partings if not telling]
    else:
        suspects, confidence, summary = _even_split(f)
        extra = []
    cycle = find_cycle(f.waits)
    if cycle is not None:
        summary += f"; {cycle_phrase(cycle, f.waits)}"
    if f.gpu:
        summary += f" ({_describe_many(f.gpu_groups)}: their CPU position is not where they are stuck)"
    return Verdict(
        kind="mismatched_collectives",
        suspect_ranks=suspects,
        confidence=confidence,
        summary=summary,
        evidence=[*f.evidence, *extra],
        next_steps=[
            _step(
                "Open the suspects' call site: look for a collective inside a rank- or data-dependent branch, "
                "an early `continue`/`break`, or collectives issued in a different order on some ranks.",
                None,
                "mismatched-collectives",
            ),
            *(
                []
                if _on_gloo(f.backend)
                else [
                    _step(
                        "On NCCL jobs, confirm with the flight recorder which collective sequence number diverged.",
                        "analyze_flight_recorder",
                        "mismatched-collectives",
                    )
                ]
            ),
            _step(
                "Write a minimal repro of the mismatch to verify the fix.",
                "generate_repro",
                "mismatched-collectives",
            ),
        ],
    )


def _left_in_subgroup(f: Facts, majority: Group, minority: list[Group]) -> Verdict | None:
    """The minority waits in a collective on a subgroup while the others went on: it is left waiting.

    A subgroup collective completes only when every member calls it; a member that skipped it
    went on to the next collective with the majority. The minority is the victim, and the culprit
    is the member of its group that went on: read from the job's locals (a table of groups or a
    list of ranks, :mod:`~rankscope.analysis.group_members`), else from the flight recorder, else
    not named at all.
    """
    by_rank = {s.rank: s for s in f.live}
    waiting = [r for g in minority for r in g.ranks]
    if not waiting or not all(by_rank.get(r) is not None and by_rank[r].subgroup for r in waiting):
        return None
    if any(by_rank.get(r) is not None and by_rank[r].subgroup for r in majority.ranks):
        return None
    who = ranks_phrase(waiting)
    where = (
        f"{'; '.join(_describe(g) for g in minority)} on a subgroup while {_describe(majority)}: a subgroup "
        "collective completes only when every member of that group calls it"
    )
    named = _members_gone_on(f, waiting, majority)
    if named is not None:
        culprits, evidence, confidence = named
        verb = "has" if len(culprits) == 1 else "have"
        return _subgroup_verdict(
            f,
            culprits,
            confidence,
            f"{where}; {ranks_phrase(culprits)}, of {who}'s group, {verb} gone on to "
            f"{majority.op or 'the next collective'} with the others: {'it' if len(culprits) == 1 else 'they'} "
            f"skipped the group's collective (or {who} called one its group does not)",
            [evidence, *f.evidence],
        )
    if f.flight is not None and f.flight.verdict.suspect_ranks:
        fr = f.flight.verdict
        return _subgroup_verdict(
            f,
            list(fr.suspect_ranks),
            fr.confidence,
            f"{where}; flight recorder: {fr.summary}",
            [f"flight recorder: {line}" for line in fr.evidence[:6]] + f.evidence,
        )
    summary = (
        f"{where}, so {who} {'are' if len(waiting) > 1 else 'is'} left waiting by a member of its group that went "
        f"on with {ranks_phrase(majority.ranks)} (or {who} called a collective its group does not): the stacks do "
        "not show the group's members, so they name no culprit"
    )
    return _subgroup_verdict(f, [], "low", summary, f.evidence)


def _members_gone_on(
    f: Facts, waiting: list[int], majority: Group
) -> tuple[list[int], str, Confidence] | None:
    """The members of the waiting ranks' groups that went on with the majority, read from locals."""
    culprits: set[int] = set()
    evidence: list[str] = []
    table = True
    for rank in waiting:
        read = group_members(rank, f.live)
        if read is None:
            return None
        found, text, from_table = read
        culprits |= {r for r in found if r in majority.ranks}
        evidence.append(text)
        table = table and from_table
    if not culprits:
        return None
    return sorted(culprits), "; ".join(dict.fromkeys(evidence)), "high" if table else "medium"


def _subgroup_verdict(
    f: Facts, suspects: list[int], confidence: Confidence, summary: str, evidence: list[str]
) -> Verdict:
    steps = []
    if suspects:
        steps.append(
            _step(
                f"Open {ranks_phrase(suspects)}'s loop around the group's collective: a rank- or data-dependent "
                "branch, an early `continue`/`break`, that skips it on that rank.",
                None,
                "mismatched-collectives",
            )
        )
    else:
        steps.append(
            _step(
                "Find the members of the waiting ranks' group where it is built (new_group / DeviceMesh), then "
                "which of them skipped the collective: a rank- or data-dependent branch around it.",
                None,
                "mismatched-collectives",
            )
        )
    steps.append(
        _step(
            "Read the flight recorder: its entries name each collective's process group and members.",
            "analyze_flight_recorder",
            "mismatched-collectives",
        )
    )
    if suspects:
        steps.append(
            _step(
                "Write a minimal repro of the skipped collective.", "generate_repro", "mismatched-collectives"
            )
        )
    return Verdict(
        kind="mismatched_collectives",
        suspect_ranks=suspects,
        confidence=confidence,
        summary=summary,
        evidence=evidence,
        next_steps=steps,
    )


def _even_split(f: Facts) -> tuple[list[int], Confidence, str]:
    """Ranks split evenly between collectives: a rank condition above one side's call decides it."""
    described = "; ".join(_describe(g) for g in f.op_groups)
    ruled = [
        (g, p) for g in f.op_groups if (p := guard_phrase(f, g)) and f.guards[g.ranks[0]][0].kind == "rank"
    ]
    if len(ruled) == 1:
        group, phrase = ruled[0]
        return (
            list(group.ranks),
            "medium",
            f"{described}: the ranks split evenly, but {phrase}: {ranks_phrase(group.ranks)} "
            f"{'run' if len(group.ranks) > 1 else 'runs'} a collective under a rank condition that the others "
            "never call (call it on every rank, or guard only the work that is not a collective)",
        )
    return (
        sorted(r for g in f.op_groups for r in g.ranks),
        "low",
        f"{described}: the ranks split evenly between different collectives, so no majority names the culprit; "
        "compare the call sites for a rank-dependent branch",
    )


def rule_missing(f: Facts) -> Verdict | None:
    """Ranks of the world that exited are the suspects; ranks merely on another host are not.

    A rank that is not on this host cannot be blamed from here: the verdict says so, names no
    suspect for it, and its first step collects the other hosts. After a capture merged from
    several hosts, a rank found on none of them is a suspect (it exited or was never started).
    """
    gone = sorted(set(f.missing) | set(f.exited))
    if not gone:
        return None
    here = ranks_phrase(sorted({s.rank for s in f.live if s.rank is not None}))
    what = (
        _describe(f.op_groups[0])
        if f.op_groups
        else f"{here} {'are' if len(f.live) > 1 else 'is'} in no collective"
    )
    away = sorted(set(f.missing) - set(f.exited))
    merged = len(f.job.hosts) > 1
    local_only = is_loopback(f.job.master_addr)
    blamed = sorted(set(f.exited) | (set(away) if merged or local_only else set()))
    parts = [f"{ranks_phrase(f.exited)} exited"] if f.exited else []
    if away and local_only:
        parts.append(
            f"{ranks_phrase(away)} not found, though MASTER_ADDR {f.job.master_addr} is this host's loopback so "
            "every rank runs here: never started or already gone"
        )
    elif away:
        where = f"any of {len(f.job.hosts)} hosts" if merged else "this host"
        parts.append(
            f"{ranks_phrase(away)} not found on {where}" + ("" if merged else " (not visible from here)")
        )
    if blamed:
        who = f"{ranks_phrase(blamed)} {'are the suspects' if len(blamed) > 1 else 'is the suspect'}"
        summary = f"{what}; {'; '.join(parts)}: {who}"
    else:
        summary = (
            f"{what}; {'; '.join(parts)}: a rank on another host cannot be blamed from here; collect the other "
            "hosts' stacks"
        )
    return Verdict(
        kind="missing_ranks",
        suspect_ranks=blamed,
        confidence="high" if f.exited else ("medium" if blamed else "low"),
        summary=summary,
        evidence=f.evidence,
        next_steps=_missing_steps(f, away),
    )


def is_loopback(addr: str | None) -> bool:
    """MASTER_ADDR that only this host can reach: the job cannot span hosts."""
    return addr is not None and (addr.startswith("127.") or addr in ("localhost", "::1", "ip6-localhost"))


def _missing_steps(f: Facts, away: list[int]) -> list[NextStep]:
    steps = []
    if away:
        steps.append(
            _step(
                "Collect stacks from the other hosts (rankscope stacks --hosts ... / dump_stacks with hosts).",
                "dump_stacks",
                "missing-ranks",
            )
        )
    if f.exited:
        steps.append(
            _step(
                "Read the logs of the exited ranks for their exception or exit code.",
                "triage_logs",
                "missing-ranks",
            )
        )
    steps.append(_step("Check which jobs and ranks run on this host.", "list_jobs", "missing-ranks"))
    return steps


def rule_nccl_cannot_tell(f: Facts) -> Verdict | None:
    """NCCL: every live rank waits for the GPU (or in the same collective): the CPU side cannot tell who is stuck."""
    if not f.nccl or not f.gpu or f.idle or len(f.op_groups) > 1:
        return None
    where = "; ".join(_describe(g) for g in [*f.gpu_groups, *f.op_groups])
    return Verdict(
        kind="inconclusive",
        confidence="low",
        summary=f"{where}: on NCCL a rank that waits for the GPU is queued behind a stuck collective, so where the "
        "CPUs stop says nothing about which rank is stuck; the CPU side cannot tell, the collective state can",
        evidence=f.evidence,
        next_steps=_collective_state_steps(f),
    )


def _collective_state_steps(f: Facts) -> list[NextStep]:
    """Where the collective state is: the flight recorder (now, or after the watchdog timeout), then the counters."""
    recorder = f.job.recorder or (
        "Read the flight recorder: each rank dumps it on the watchdog timeout (default 10 min) to "
        "$TORCH_FR_DUMP_TEMP_FILE<rank> or ~/.cache/torch/comm_lib_trace_rank_<rank>; analyze those files. If the "
        "job opened TORCH_NCCL_DEBUG_INFO_PIPE_FILE, write to <that path><rank>.pipe to get a dump now. For the "
        "next run keep TORCH_FR_BUFFER_SIZE>0 and TORCH_NCCL_DUMP_ON_TIMEOUT=1 (the defaults in torch 2.13)."
    )
    steps = [
        _step(recorder, "analyze_flight_recorder", "nccl-hangs"),
        _step(
            "Dump again with locals: progress counters (step, epoch) that differ between ranks name the laggard.",
            "dump_stacks",
            "progress-counters",
        ),
        _step(
            "Read the logs for the watchdog's last enqueued/completed sequence numbers per rank.",
            "triage_logs",
            "nccl-hangs",
        ),
    ]
    if f.ras is None:
        steps.append(
            NextStep(
                action="Ask NCCL RAS (NCCL >= 2.24) for each rank's launch counts: the rank behind is the one that "
                "never enqueued the collective. Off by default: querying RAS has crashed jobs on NCCL 2.26-2.29.",
                tool="dump_stacks",
                args={"ras": True},
                skill_section=f"{_PLAYBOOK}#nccl-hangs",
            )
        )
    return steps


def rule_all_in_same(f: Facts) -> Verdict | None:
    """Every rank waits in the same collective at the same line: the ranks agree, the hang is elsewhere."""
    if len(f.op_groups) != 1 or f.idle:
        return None
    g = f.op_groups[0]
    if g.op in P2P_DIRECTION:
        return _all_in_same_p2p(g, f.waits, f.evidence, f.backend)
    if f.backend in ("nccl", "mixed"):
        return _nccl_same_line(f, g)
    summary = (
        f"all {len(g.ranks)} ranks wait in {g.op} at {short_site(g.call_site)}: the ranks agree, so the hang is "
        f"elsewhere (a rank on another host, {_transport(f.backend)}"
        + (")" if _on_gloo(f.backend) else ", or a GPU)")
    )
    return Verdict(
        kind="all_in_same_collective",
        suspect_ranks=[],
        confidence="low",
        summary=summary,
        evidence=f.evidence,
        next_steps=[
            _step(
                "If the job spans hosts, collect the other hosts' ranks too.",
                "dump_stacks",
                "all-in-same-collective",
            ),
            _step(
                "Check the communication environment (the backend's variables, interfaces, versions).",
                "collect_env",
                "all-in-same-collective",
            ),
            *(
                []
                if _on_gloo(f.backend)
                else [
                    _step(
                        "Read the flight recorder dumps (NCCL) to see which rank did not complete the collective.",
                        "analyze_flight_recorder",
                        "all-in-same-collective",
                    )
                ]
            ),
            _step(
                "Search the logs for transport errors and watchdog messages.",
                "triage_logs",
                "all-in-same-collective",
            ),
        ],
    )


def _nccl_same_line(f: Facts, g: Group) -> Verdict:
    """NCCL: every rank's CPU stands in one collective at one line, yet that is not one collective.

    A rank that issued fewer collectives earlier (a skipped step) reaches the same final barrier
    with a lower sequence number than the others; its CPU stands on the same line. Only the
    collective state (recorder, RAS) tells them apart.
    """
    return Verdict(
        kind="inconclusive",
        confidence="low",
        summary=f"all {len(g.ranks)} ranks stand in {g.op} at {short_site(g.call_site)}: on NCCL that does not "
        "show they are in the same collective (a rank that issued fewer collectives earlier reaches the same "
        "line behind the others), so the CPU side cannot tell; the collective state can",
        evidence=f.evidence,
        next_steps=_collective_state_steps(f),
    )


def rule_stopped(f: Facts) -> Verdict | None:
    """Only stopped ranks: the job is stopped, not hung in a collective."""
    if not f.stuck or f.live:
        return None
    who = ranks_phrase([s.rank for s in f.stuck if s.rank is not None])
    return Verdict(
        kind="no_collective",
        suspect_ranks=sorted(s.rank for s in f.stuck if s.rank is not None),
        confidence="high",
        summary=f"{who} {'are' if len(f.stuck) > 1 else 'is'} not running "
        f"({', '.join(sorted({_STATE_WORDS[s.state] for s in f.stuck}))}): the job is stopped, not hung in a collective",
        evidence=f.evidence,
        next_steps=[
            _step(
                "Resume the job (SIGCONT, `fg`, detach the debugger) or check the kernel/driver for D state.",
                None,
                "stopped-ranks",
            ),
            _step("Dump again once the ranks run.", "dump_stacks", "stopped-ranks"),
        ],
    )


def rule_no_collective(f: Facts) -> Verdict:
    """No rank waits in a collective or for the GPU: the job is stuck (or slow) in its own code."""
    sites = "; ".join(_describe(g) for g in f.none_groups) or "no rank is in a collective"
    return Verdict(
        kind="no_collective",
        suspect_ranks=[],
        confidence="low",
        summary=f"{sites}: no rank waits in a collective, so the job is stuck (or slow) in its own code: "
        "compute, data loading, a lock, a queue or I/O"
        + (
            ""
            if f.nccl or _on_gloo(f.backend)
            else " (on an NCCL job, dump with --native: a CPU waiting for the GPU looks like this)"
        ),
        evidence=f.evidence,
        next_steps=[
            _step(
                "Dump again in a few seconds: if the stacks move, the job is slow, not hung.",
                "dump_stacks",
                "no-collective",
            ),
            _step(
                "Dump with --native and --locals to see what the main thread waits on (DataLoader workers, locks, "
                "the GPU).",
                "dump_stacks",
                "no-collective",
            ),
            _step(
                "Check the memory of the ranks if they may be swapping or near OOM.",
                "inspect_memory",
                "no-collective",
            ),
        ],
    )


Rule = Callable[[Facts], "Verdict | None"]

NCCL_RULES: tuple[Rule, ...] = (
    rule_nothing_captured,
    rule_flight_recorder,
    rule_ras,
    rule_counters,
    rule_nccl_rank_elsewhere,
    rule_gpu_idle,
    rule_nccl_lone_collective,
    rule_divergent,
    rule_mismatched,
    rule_missing,
    rule_nccl_cannot_tell,
    rule_all_in_same,
    rule_stopped,
)
"""On NCCL (or when a rank waits for the GPU): recorder and counters before CPU positions."""

GLOO_RULES: tuple[Rule, ...] = (
    rule_nothing_captured,
    rule_divergent,
    rule_mismatched,
    rule_missing,
    rule_counters,
    rule_all_in_same,
    rule_stopped,
)
"""On gloo a collective blocks the CPU: where the CPUs stop decides; counters break what it leaves open."""


def decide(f: Facts) -> Verdict:
    """The first rule of the backend's table that matches; :func:`rule_no_collective` when none does."""
    for rule in NCCL_RULES if f.nccl else GLOO_RULES:
        verdict = rule(f)
        if verdict is not None:
            return with_call_args(_tie_break(f, verdict))
    return with_call_args(rule_no_collective(f))


def with_call_args(verdict: Verdict) -> Verdict:
    """Each next step that names a tool, with the arguments to call it with, so the agent's next
    call is written out (a repro from this very answer; the suspects' stacks, native when the
    step asks for native frames)."""
    steps = []
    for step in verdict.next_steps:
        args: dict[str, object] | None = step.args
        if args is None and step.tool == "generate_repro" and verdict.kind != "no_collective":
            args = {"from_last_stacks": True}
        elif args is None and step.tool == "dump_stacks":
            args = {"native": True} if "native" in step.action else {}
            if "with locals" in step.action or "and locals" in step.action:
                args["locals"] = True
            if verdict.suspect_ranks:
                args["full_ranks"] = verdict.suspect_ranks[:4]
        steps.append(step.model_copy(update={"args": args or None}) if args != step.args else step)
    return verdict.model_copy(update={"next_steps": steps})


_OPEN_KINDS = ("inconclusive", "all_in_same_collective", "no_collective")


def _tie_break(f: Facts, verdict: Verdict) -> Verdict:
    """What the CPU positions leave open, a weaker counter split may lead.

    An even split between collectives is decided by the counters (at their confidence); a
    verdict that names no one (every rank at the same GPU wait or collective) gets the
    counters' suspects as a low-confidence lead, with its next steps kept.
    """
    split = f.counters
    if split is None or not split.suspects or not f.live or verdict.confidence != "low":
        return verdict
    if verdict.kind == "mismatched_collectives":
        return verdict.model_copy(
            update={
                "suspect_ranks": split.suspects,
                "confidence": split.confidence,
                "summary": f"{verdict.summary}; the progress counters decide: {split.summary}",
            }
        )
    if verdict.kind in _OPEN_KINDS and not verdict.suspect_ranks:
        return verdict.model_copy(
            update={
                "kind": "divergent_ranks",
                "suspect_ranks": split.suspects,
                "summary": f"{verdict.summary}; the only lead, weak: {split.summary}",
            }
        )
    return verdict


def _describe_many(groups: list[Group]) -> str:
    return "; ".join(_describe(g) for g in groups)


def _all_in_same_p2p(g: Group, waits: Waits, evidence: list[str], backend: Backend | None = None) -> Verdict:
    """Every rank blocked in the same send (or recv) at the same line.

    Unlike a collective, this is rarely the transport: a blocking recv returns only once
    its peer sends, so when every rank receives, nobody sends, unless the sends were
    posted earlier with isend. The peers (``waits``, read from the calls' locals) turn that
    into a named cycle.
    """
    direction = P2P_DIRECTION[g.op or ""]
    cycle = find_cycle(waits)
    where = f"all {len(g.ranks)} ranks wait in {g.op} at {short_site(g.call_site)}"
    other = "sends" if direction == "recv" else "receives"
    if cycle is not None:
        summary = f"{where}; {cycle_phrase(cycle, waits)}"
    else:
        summary = (
            f"{where}, so no rank {other}: a blocking {direction} returns only when its peer {other[:-1]}s, so "
            f"unless the matching {other[:-1]}s were posted earlier (isend/irecv) this is a send/recv ordering "
            f"deadlock in the program; otherwise {_transport(backend)} is stuck"
        )
    steps = [
        _step(
            "Order the point-to-point calls so one side of each pair sends while the other receives: alternate "
            "send/recv by rank parity, or post both with batch_isend_irecv (or isend + irecv, then wait on both).",
            None,
            "point-to-point-deadlock",
        )
    ]
    if cycle is None and len(waits) < len(g.ranks):
        steps.append(
            _step(
                "Dump with locals (--locals / locals=True) to read the arguments of the send/recv calls whose "
                "peer could not be read (src/dst, group): a recv from any source or on a subgroup.",
                "dump_stacks",
                "point-to-point-deadlock",
            )
        )
    steps += [
        _step(
            "If the sends were posted earlier with isend, check the transport: the environment and the logs.",
            "collect_env",
            "all-in-same-collective",
        ),
        *(
            []
            if _on_gloo(backend)
            else [
                _step(
                    "On NCCL, read the flight recorder: its send/recv entries show which pairs were posted and never "
                    "matched.",
                    "analyze_flight_recorder",
                    "point-to-point-deadlock",
                )
            ]
        ),
        _step(
            "Verify the diagnosis with a minimal repro of the exchange (generate_repro from this report).",
            "generate_repro",
            "point-to-point-deadlock",
        ),
    ]
    return Verdict(
        kind="all_in_same_collective",
        suspect_ranks=[],
        confidence="high" if cycle is not None else "medium",
        summary=summary,
        evidence=evidence,
        next_steps=steps,
    )
