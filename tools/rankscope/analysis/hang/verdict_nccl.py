"""The hang rules that only hold on NCCL, where a collective returns once its kernel is enqueued.

A rank waiting for the GPU (``wait`` = gpu, launch_queue, allocator) is queued behind a stuck
kernel and is never "the rank that did not reach the collective". What decides instead: the
flight recorder's sequence numbers, NCCL RAS's launch counts, a rank that waits for neither a
collective nor the GPU, a GPU that idles while the others spin, a collective only a few ranks
are in; when none does, the CPU side cannot tell, and the steps say where the collective
state is.
"""

from __future__ import annotations

import os

from rankscope.analysis.hang.frames import main_thread, short_site
from rankscope.analysis.hang.verdict_facts import Facts, Ruling
from rankscope.analysis.hang.verdict_mismatch import guard_fix, library_fix, loop_fix
from rankscope.analysis.hang.verdict_phrases import (
    are,
    call_phrase,
    describe,
    describe_all,
    guard_phrase,
    parting_phrase,
    recorder_lines,
    stopped_groups,
)
from rankscope.analysis.hang.verdict_texts import Step, say, step
from rankscope.analysis.hang.waits import GPU_LIKE, inferred, python_frames_only
from rankscope.analysis.p2p import P2P_DIRECTION
from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.core import Group


def rule_flight_recorder(f: Facts) -> Ruling | None:
    """On NCCL the recorder's sequence numbers outrank CPU positions: its suspects decide."""
    if f.flight is None or not f.flight.verdict.suspect_ranks or not f.nccl:
        return None
    fr = f.flight.verdict
    return Ruling(
        kind="mismatched_collectives" if f.flight.first_mismatch is not None else "divergent_ranks",
        suspects=list(fr.suspect_ranks),
        confidence="high",
        summary=say("recorder_decides", summary=fr.summary),
        evidence=recorder_lines(fr) + f.evidence,
        steps=tuple(fr.next_steps[:3]),
    )


def rule_ras(f: Facts) -> Ruling | None:
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
        return Ruling(
            kind="all_in_same_collective",
            suspects=[],
            confidence="medium",
            summary=say("ras_agree", summary=r.summary),
            evidence=evidence,
            steps=(step("recorder_enqueued_none_completed"), step("env_nccl"), step("logs_nccl_warn")),
        )
    if not r.suspect_ranks:
        return None
    return Ruling(
        kind="missing_ranks" if r.kind == "lost" else "divergent_ranks",
        suspects=list(r.suspect_ranks),
        confidence=r.confidence,
        summary=say("ras_decides", summary=r.summary),
        evidence=evidence,
        steps=(step("dump_native_locals_launch"), step("recorder_never_enqueued")),
    )


def rule_nccl_library_call(f: Facts) -> Ruling | None:
    """NCCL: a few ranks are inside a library call that is itself a collective, and the others are not.

    On NCCL the call's collective is enqueued and the CPU stops at its next GPU wait inside the
    call (``.item()`` in ZeRO's ``_broadcast_object``) or in a later collective's enqueue, while
    the others went on and wait for the GPU behind a collective of theirs: the few are the ones
    that made the call alone. High when a rank condition above the call says so, or the counters
    name the same ranks; medium otherwise.
    """
    if not f.nccl or f.stuck or not f.calls:
        return None
    marks = {r: (c.frame.function, c.frame.file) for r, c in f.calls.items()}
    seen = {
        s.rank: {(fr.function, fr.file) for fr in t.frames}
        for s in f.live
        if s.rank is not None and (t := main_thread(s)) is not None
    }
    # in the call, and no rank outside it runs that call's frame (those in the same call are its company)
    alone = sorted(
        r
        for r, mark in marks.items()
        if not any(mark in held for o, held in seen.items() if marks.get(o) != mark)
    )
    others = [g for g in f.groups if g.state is None and not set(g.ranks) & set(alone)]
    if (
        not alone
        or len(alone) * 2 >= len(f.live)
        or sum(len(g.ranks) for g in others) + len(alone) != len(f.live)
    ):
        return None
    call = f.calls[alone[0]]
    if any(f.calls[r].name != call.name for r in alone):
        return None
    guarded = all(r in f.guards and f.guards[r][0].kind == "rank" for r in alone)
    counted = f.counters is not None and f.counters.suspects == alone
    summary = call_phrase(f, alone, call, describe_all(others))
    if alone[0] in f.guards:
        guard, site = f.guards[alone[0]]
        summary += f"; {guard.phrase(os.path.basename(site.file), 'call', site.line)}"
    return Ruling(
        kind="mismatched_collectives",
        suspects=alone,
        confidence="high" if guarded or counted else "medium",
        summary=summary + say("cpu_not_where_stuck_call"),
        evidence=f.evidence,
        steps=(library_fix(f, alone, any_wait=True) or step("open_mismatch_site"), step("recorder_lone")),
    )


def rule_nccl_rank_elsewhere(f: Facts) -> Ruling | None:
    """NCCL: peers wait for the GPU (or in a collective) while some ranks wait for neither: those are the suspects."""
    if not f.nccl or not f.gpu or not (f.idle or f.stuck):
        return None
    suspects = sorted({s.rank for s in [*f.idle, *f.stuck] if s.rank is not None})
    # Python frames alone cannot show a kernel launch blocked under a Python call, nor a GPU wait
    # without a tell-tale line: the suspects' "other" and the peers' "gpu" are then less sure
    unsure = any(inferred(s.wait_evidence) for s in f.gpu) or any(
        python_frames_only(s.wait_evidence) for s in f.idle
    )
    parts = [describe(g) for g in f.none_groups] + stopped_groups(f)
    return Ruling(
        kind="divergent_ranks",
        suspects=suspects,
        confidence="medium" if unsure else "high",
        summary=say(
            "rank_elsewhere",
            parts="; ".join(parts),
            waiting=describe_all([*f.gpu_groups, *f.op_groups]),
            who=ranks_phrase(suspects),
        ),
        evidence=f.evidence,
        steps=(step("read_suspects_stack"), step("confirm_native"), step("recorder_laggard")),
    )


def rule_gpu_idle(f: Facts) -> Ruling | None:
    """NCCL: most GPUs spin in a stuck kernel while a few idle: their ranks never launched it."""
    if f.gpu_idle is None or not f.nccl:
        return None
    idle, text = f.gpu_idle
    return Ruling(
        kind="divergent_ranks",
        suspects=idle,
        confidence="medium",
        summary=say("gpu_idle", text=text, who=ranks_phrase(idle)),
        evidence=f.evidence,
        steps=(step("dump_native_not_launching"), step("recorder_suspects_below")),
    )


def rule_nccl_lone_collective(f: Facts) -> Ruling | None:
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
    op = next(iter(ops))
    if len(ops) != 1 or op in P2P_DIRECTION:
        return None
    suspects = sorted(s.rank for s in inside if s.rank is not None)
    # a wait inferred from an unread line (maybe_gpu) may be something else: then only a lead
    unsure = any(s.wait == "maybe_gpu" for s in past)
    who = ranks_phrase(suspects)
    return Ruling(
        kind="mismatched_collectives",
        suspects=suspects,
        confidence="low" if unsure else "medium",
        summary=say(
            "lone",
            who=who,
            are=are(len(suspects)),
            op=op,
            sites=", ".join(sorted({short_site(s.call_site) for s in inside})),
            others=describe_all([g for g in f.gpu_groups if not g.op]),
            story=_lone_story(f, op),
        ),
        evidence=f.evidence,
        steps=(
            guard_fix(f, suspects) or _lone_fix(f, op) or step("read_lone_site", op=str(op)),
            step("recorder_lone"),
        ),
    )


def _lone_fix(f: Facts, op: str | None) -> Step | None:
    """The fix when the lone ranks left a loop the others are still in (uneven inputs)."""
    lone = next((g for g in f.groups if g.op == op and g.state is None), None)
    if lone is None or not f.gpu_groups or guard_phrase(f, lone):
        return None
    return loop_fix(f, [lone], max(f.gpu_groups, key=lambda g: len(g.ranks)))


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


def rule_nccl_cannot_tell(f: Facts) -> Ruling | None:
    """NCCL: every live rank waits for the GPU (or in the same collective): the CPU side cannot tell who is stuck."""
    if not f.nccl or not f.gpu or f.idle or len(f.op_groups) > 1:
        return None
    return Ruling(
        kind="inconclusive",
        suspects=[],
        confidence="low",
        summary=say("cannot_tell", where=describe_all([*f.gpu_groups, *f.op_groups])),
        evidence=f.evidence,
        steps=collective_state_steps(f),
    )


def nccl_same_line(f: Facts, g: Group) -> Ruling:
    """NCCL: every rank's CPU stands in one collective at one line, yet that is not one collective.

    A rank that issued fewer collectives earlier (a skipped step) reaches the same final barrier
    with a lower sequence number than the others; its CPU stands on the same line. Only the
    collective state (recorder, RAS) tells them apart.
    """
    return Ruling(
        kind="inconclusive",
        suspects=[],
        confidence="low",
        summary=say("nccl_same_line", n=len(g.ranks), op=g.op, site=short_site(g.call_site)),
        evidence=f.evidence,
        steps=collective_state_steps(f),
    )


def collective_state_steps(f: Facts) -> tuple[Step, ...]:
    """Where the collective state is: the flight recorder (now, or after the watchdog timeout), then
    the counters and the logs; RAS when it was not asked yet."""
    recorder = step("recorder_of_job", recorder=f.job.recorder) if f.job.recorder else step("recorder_howto")
    steps = (recorder, step("dump_locals_counters"), step("logs_watchdog_seq"))
    return (*steps, step("ask_ras")) if f.ras is None else steps


__all__ = [
    "collective_state_steps",
    "nccl_same_line",
    "rule_flight_recorder",
    "rule_gpu_idle",
    "rule_nccl_cannot_tell",
    "rule_nccl_lone_collective",
    "rule_nccl_rank_elsewhere",
    "rule_ras",
]
