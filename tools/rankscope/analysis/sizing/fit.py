"""Fit any answer into a byte budget, saying what was cut and how to get it back.

The tools bound their answers where they know what matters (dump_stacks keeps the
groups and the suspects, triage keeps the most severe findings). This is the net under
all of them: whatever the input (a folder of 10,000 dumps, a 1 GB log, 1,024 ranks), the
answer an agent reads stays under the budget. It works on the compact JSON data, cuts
the list that weighs most to its head (lists are ordered most important first) or
shortens the longest string, and repeats until the data fits. Every cut is named in
``left_out`` with what was kept, so nothing is lost silently.
"""

from __future__ import annotations

import json
from typing import Any

MIN_STRING = 200
"""Strings are never cut below this many characters (a summary must stay readable)."""

NOTE_RESERVE = 600
"""Bytes kept free for the ``left_out`` lines once anything must be cut."""

MAX_NOTES = 6


def size_of(data: Any) -> int:
    """Bytes of ``data`` as compact JSON (what a client serialises for its model)."""
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())


def _heaviest(data: Any, path: str, best: list[Any]) -> int:
    """Size of ``data``; records in ``best`` the heaviest cuttable node (size, path, parent, key)."""
    if isinstance(data, dict):
        total = 2
        for key, value in data.items():
            if key == "left_out":
                total += size_of(value)
                continue
            sub = _heaviest(value, f"{path}.{key}" if path else key, best)
            total += sub + len(key) + 4
            if _cuttable(value) and (best[0] is None or sub > best[0]):
                best[:] = [sub, f"{path}.{key}" if path else key, data, key]
        return total
    if isinstance(data, list):
        total = 2
        for i, value in enumerate(data):
            sub = _heaviest(value, f"{path}[{i}]", best)
            total += sub + 1
            if _cuttable(value) and (best[0] is None or sub > best[0]):
                best[:] = [sub, f"{path}[{i}]", data, i]
        return total
    return size_of(data)


def _prefix_without(items: list[Any], over: int) -> int:
    """How many leading items to keep so that at least ``over`` bytes go (at least one kept)."""
    removed, keep = 0, len(items)
    while keep > 1 and removed < over:
        keep -= 1
        removed += size_of(items[keep]) + 1
    return keep


def _cuttable(value: Any) -> bool:
    return (isinstance(value, list) and len(value) > 1) or (
        isinstance(value, str) and len(value) > MIN_STRING
    )


def fit(data: dict[str, Any], max_bytes: int, how: str) -> dict[str, Any]:
    """``data`` cut until its JSON is at most ``max_bytes``; ``how`` says how to get it whole.

    The cuts are listed in ``data["left_out"]`` (one line each: where, what was kept). ``data``
    is modified in place and returned.
    """
    notes: dict[str, str] = {}
    original: dict[str, int] = {}  # each cut node's length before its first cut
    budget = max_bytes - NOTE_RESERVE if size_of(data) > max_bytes else max_bytes
    while size_of(data) > budget:
        best: list[Any] = [None, "", None, None]
        _heaviest(data, "", best)
        _, path, parent, key = best
        if parent is None:
            break
        value = parent[key]
        over = size_of(data) - budget
        if isinstance(value, list):
            keep = _prefix_without(value, over)
            total = original.setdefault(path, len(value))
            parent[key] = value[:keep]
            notes[path] = f"{path}: first {keep} of {total} kept"
        else:
            total = original.setdefault(path, len(value))
            keep = max(MIN_STRING, min(len(value) // 2, len(value) - over - 40))
            parent[key] = value[:keep] + f" [... {total - keep} characters cut]"
            notes[path] = f"{path}: first {keep} of {total} characters kept"
    if notes:
        cuts = list(notes.values())
        if len(cuts) > MAX_NOTES:
            cuts = [*cuts[: MAX_NOTES - 1], f"... and {len(cuts) - MAX_NOTES + 1} more cuts"]
        data["left_out"] = [*data.get("left_out", []), *cuts, how]
    return data
