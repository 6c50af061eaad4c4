"""Compact rank lists: ``[0, 1, 2, 4]`` -> ``"0-2,4"``.

The one formatter for rank sets in every report, renderer and verdict, so a
user reads the same notation whichever command they ran.
"""

from __future__ import annotations

import re
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


def value_span(values: Iterable[int], unit: str = "") -> str:
    """``95-100%`` for the lowest and highest of ``values``, or ``100%`` when they are all the same."""
    seen = list(values)
    low, high = min(seen), max(seen)
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


_RANK_LINE = re.compile(r"^rank (\d+): (.+)$")


def merge_rank_lines(lines: list[str]) -> list[str]:
    """``rank 0: saw X``, ``rank 1: saw X`` -> ``ranks 0-1: saw X``, in the place of the first one."""
    texts: dict[str, list[int]] = {}
    for line in lines:
        m = _RANK_LINE.match(line)
        if m:
            texts.setdefault(m.group(2), []).append(int(m.group(1)))
    out: list[str] = []
    done: set[str] = set()
    for line in lines:
        m = _RANK_LINE.match(line)
        if not m or len(texts[m.group(2)]) == 1:
            out.append(line)
        elif m.group(2) not in done:
            done.add(m.group(2))
            out.append(f"ranks {rank_ranges(sorted(texts[m.group(2)]))}: {m.group(2)}")
    return out
