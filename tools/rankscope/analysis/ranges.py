"""Compact rank lists: ``[0, 1, 2, 4]`` -> ``"0-2,4"``.

The one formatter for rank sets in every report, renderer and verdict, so a
user reads the same notation whichever command they ran.
"""

from __future__ import annotations

from collections.abc import Iterable


def rank_ranges(ranks: Iterable[int], empty: str = "none") -> str:
    """Render sorted unique ranks as ranges, the way people write them (``empty`` for no ranks)."""
    values = sorted(set(ranks))
    if not values:
        return empty
    parts: list[str] = []
    start = prev = values[0]
    for r in values[1:]:
        if r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = r
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def ranks_phrase(ranks: Iterable[int], empty: str = "none") -> str:
    """``"rank 2"`` or ``"ranks 0-1,3"`` (``"ranks <empty>"`` for no ranks)."""
    values = sorted(set(ranks))
    return f"rank {values[0]}" if len(values) == 1 else f"ranks {rank_ranges(values, empty)}"
