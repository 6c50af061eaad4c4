"""Point-to-point waits across ranks: who waits on whom, and the cycles no send can break.

Shared by the live stacks analysis (peers read from the locals of send/recv) and the
flight recorder (peers read from ``nccl:send 0->1`` / ``nccl:recv 1<-0`` entries). Pure.
"""

from __future__ import annotations

P2P_DIRECTION: dict[str, str] = {
    "send": "send",
    "recv": "recv",
    "send_object_list": "send",
    "recv_object_list": "recv",
}
"""Blocking point-to-point calls of c10d and the direction each waits in: a blocking recv
returns only once its peer sends, a send (beyond transport buffers) once its peer receives."""

Waits = dict[int, tuple[str, int]]
"""rank -> (direction, peer): the ``send`` or ``recv`` the rank is blocked in, and the other rank."""


def verb(direction: str) -> str:
    """``sends to`` / ``receives from``."""
    return "sends to" if direction == "send" else "receives from"


def is_matched(rank: int, waits: Waits) -> bool:
    """True when the rank's peer waits in the opposite direction with this rank: data can flow."""
    direction, peer = waits[rank]
    other = waits.get(peer)
    return other is not None and other[1] == rank and other[0] != direction


def find_cycle(waits: Waits) -> list[int] | None:
    """Ranks that wait on each other in a cycle with no matched pair: a send/recv deadlock.

    Each blocked rank waits on one peer. A pair in which one sends to the other while the
    other receives from the first is matched (data can flow); a cycle of waits with no
    matched pair in it cannot make progress: everyone receives (or everyone sends) first.
    """
    for start in sorted(waits):
        path: list[int] = []
        cur = start
        while cur in waits and cur not in path and not is_matched(cur, waits):
            path.append(cur)
            cur = waits[cur][1]
        if cur in path:
            cycle = path[path.index(cur) :]
            if len(cycle) > 1:
                return cycle
    return None


def cycle_phrase(cycle: list[int], waits: Waits) -> str:
    """``ranks 0, 1 wait on each other in a cycle (0 receives from 1, 1 receives from 0): ...``."""
    links = ", ".join(f"{r} {verb(waits[r][0])} {waits[r][1]}" for r in cycle)
    directions = {waits[r][0] for r in cycle}
    if directions == {"recv"}:
        why = "every rank in it receives first, so none sends"
    elif directions == {"send"}:
        why = "every rank in it sends first, so none receives"
    else:
        why = "no send in it meets its recv"
    return (
        f"ranks {', '.join(map(str, cycle))} wait on each other in a cycle ({links}): {why}: "
        "a send/recv ordering deadlock in the program, unless the other side was posted earlier with "
        "isend/irecv (then the transport is stuck)"
    )


__all__ = ["P2P_DIRECTION", "Waits", "cycle_phrase", "find_cycle", "is_matched", "verb"]
