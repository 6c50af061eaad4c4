"""A ruling with the lock cycle that explains its suspect rank, when the rank's threads close one.

The rules say where a rank stopped (in no collective, while the others wait in one, or for the GPU
on NCCL); a lock cycle among that rank's threads says why it never moves again, and that the fix
is the order the locks are taken in. It leads the summary and the evidence, so the answer's first
words are the cause.
"""

from __future__ import annotations

import dataclasses

from rankscope.analysis.hang.locks import LockCycle
from rankscope.analysis.hang.verdict_facts import Facts, Ruling
from rankscope.models.core import Confidence

_SURE: dict[Confidence, int] = {"low": 0, "medium": 1, "high": 2}

_NAMES_RANK = ("divergent_ranks", "no_collective", "inconclusive", "all_in_same_collective")
"""The kinds whose suspects a lock cycle decides: a rank stopped outside a collective, or no rank named."""


def with_lock_cycle(ruling: Ruling, f: Facts) -> Ruling:
    """``ruling`` led by the lock cycles of its suspects (of any rank when it names none, where its
    kind leaves the suspect open); a ruling that names other ranks for another cause only carries the
    cycle in its evidence."""
    if not f.locks:
        return ruling
    cycles = [c for c in f.locks if c.rank in ruling.suspects] or (
        f.locks if not ruling.suspects and ruling.kind in _NAMES_RANK else []
    )
    if not cycles:
        return dataclasses.replace(ruling, evidence=[*_evidence(f.locks), *ruling.evidence])
    suspects = sorted({*ruling.suspects, *(c.rank for c in cycles if c.rank is not None)})
    sure = min((c.confidence for c in cycles), key=_SURE.__getitem__)
    return dataclasses.replace(
        ruling,
        suspects=suspects,
        confidence=max(ruling.confidence, sure, key=_SURE.__getitem__),
        summary="; ".join(c.summary() for c in cycles) + ". " + ruling.summary,
        evidence=[*_evidence(cycles), *ruling.evidence],
    )


def _evidence(cycles: list[LockCycle]) -> list[str]:
    return [line for c in cycles for line in c.evidence()]


__all__ = ["with_lock_cycle"]
