"""The evidence lines every hang verdict carries, whichever rule decides: where each group of
ranks waits (and why the capture thinks so), the rank conditions above their calls, capture
errors, missing and exited ranks, counters, GPU utilisation, send/recv peers, and the notes on
autograd and on GPU waits that keep a reader from the wrong conclusion."""

from __future__ import annotations

from rankscope.analysis.hang.frames import GONE_STATES, STUCK_STATES, short_site
from rankscope.analysis.hang.verdict_facts import Facts
from rankscope.analysis.hang.verdict_phrases import describe, guard_phrase, lone_call, state_words
from rankscope.analysis.hang.waits import GPU_LIKE
from rankscope.analysis.p2p import Waits, is_matched, verb
from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.core import RankStack

BACKWARD_OP = "autograd.backward"
"""The op of a rank inside autograd's backward with no communication frame in sight."""

MAX_P2P_LINES = 8
"""Evidence lines about send/recv peers at most: an answer for 256 ranks stays short."""


def evidence(f: Facts) -> list[str]:
    """The lines, in the order a reader needs them: where the ranks are, then what else is known."""
    lines = [*_group_lines(f), *_guard_lines(f), *_capture_lines(f)]
    if f.counters is not None:
        lines.append(f.counters.evidence)
    if f.gpu_idle is not None:
        lines.append(f.gpu_idle[1])
    lines.extend(p2p_lines(f.waits, f.annotated))
    if any(s.op == BACKWARD_OP for s in f.live):
        lines.append(
            "some ranks are inside autograd backward with no communication frame visible; if the model is wrapped "
            "in DDP they wait for the gradient all-reduce (confirm with --native)"
        )
    if f.gpu:
        lines.append(
            f"{ranks_phrase(sorted(s.rank for s in f.gpu if s.rank is not None))}: the CPU waits for the GPU; on "
            "NCCL a collective returns once enqueued, so where these CPUs stop is not where the GPU is stuck"
        )
    return lines


def _group_lines(f: Facts) -> list[str]:
    """Each group: where it waits and the frame that says so, or its process state."""
    lines: list[str] = []
    by_rank = {s.rank: s for s in f.annotated}
    for g in f.groups:
        if g.state is not None:
            lines.append(f"{ranks_phrase(g.ranks)}: process {state_words(g.state)}")
            continue
        lead = by_rank.get(g.ranks[0])
        why = (
            lead.wait_evidence
            if lead is not None and g.wait in GPU_LIKE
            else (lead.op_evidence if lead else None)
        )
        call = lone_call(f, g) if not g.op and g.wait not in GPU_LIKE else None
        if call is not None:  # no collective frame in sight, but the call it is in is one
            why = f"{call.name} is itself a collective"
        lines.append(describe(g) + (f" [{why}]" if why else ""))
    return lines


def _guard_lines(f: Facts) -> list[str]:
    """The rank conditions above the groups' calls, each said once."""
    lines: list[str] = []
    seen: set[str] = set()
    for g in f.groups:
        phrase = guard_phrase(f, g) if g.state is None else None
        if phrase and phrase not in seen:
            seen.add(phrase)
            lines.append(f"{ranks_phrase(g.ranks)}: {phrase}")
    return lines


def _capture_lines(f: Facts) -> list[str]:
    """Capture errors, ranks of the world not found, ranks that exited."""
    lines: list[str] = []
    for e in f.errors:
        who = (
            f"rank {e.rank} (pid {e.pid})"
            if e.rank is not None
            else (f"host {e.host}" if e.host else f"pid {e.pid}")
        )
        lines.append(f"{who}: capture failed: {e.kind}: {e.message}")
    if f.missing:
        lines.append(
            f"{ranks_phrase(f.missing)} of world size {f.job.world_size} not found on "
            f"{', '.join(f.job.hosts) or 'this host'}"
        )
    if f.exited:
        lines.append(f"{ranks_phrase(f.exited)} exited")
    return lines


def p2p_lines(waits: Waits, all_stacks: list[RankStack]) -> list[str]:
    """For each rank in a send/recv with a known peer, what that peer is doing."""
    by_rank = {s.rank: s for s in all_stacks if s.rank is not None}
    lines: list[str] = []
    for rank, (direction, peer) in sorted(waits.items()):
        other = by_rank.get(peer)
        if other is None:
            doing = "which was not captured"
        elif other.state in STUCK_STATES or other.state in GONE_STATES:
            doing = f"which is {state_words(other.state)}"
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


__all__ = ["BACKWARD_OP", "MAX_P2P_LINES", "evidence", "p2p_lines"]
