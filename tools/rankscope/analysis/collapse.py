"""Collapse the output of N ranks into one ordered listing.

Eight ranks printing the same ``loss 1.23`` should read as one line
(``ranks 0-7: loss 1.23``), and the one rank that printed ``loss nan`` must
stand out. Ranks are aligned with difflib against the lowest rank's lines, so
one rank printing an extra warning does not shift every later line out of
step (a purely positional alignment would report the rest of the run as
divergent).

Pure: lists of strings in, ``CollapsedLine`` models out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

from rankscope.analysis.ranges import rank_ranges, ranks_phrase
from rankscope.models.run import CollapsedLine


def format_ranks(ranks: Iterable[int]) -> str:
    """Compact rank list: ``[0, 1, 2, 4]`` -> ``"0-2,4"`` (sorted, duplicates dropped; ``""`` for none)."""
    return rank_ranges(ranks, empty="")


def rank_label(ranks: Sequence[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-2,4"``, as a line prefix."""
    return ranks_phrase(ranks, empty="")


def render_collapsed(lines: Iterable[CollapsedLine]) -> list[str]:
    """Human form: ``ranks 0-3: loss 1.23``; lines not shared by every rank are marked with ``!``."""
    out: list[str] = []
    for line in lines:
        mark = " " if line.uniform else "!"
        out.append(f"{mark} {rank_label(line.ranks)}: {line.text}")
    return out


@dataclass
class _Slot:
    """One line of the reference rank, plus what other ranks printed around it."""

    ranks: list[int] = field(default_factory=list)  # ranks that printed the reference line here
    before: dict[int, list[str]] = field(default_factory=dict)  # extra lines a rank printed before it
    instead: dict[int, list[str]] = field(default_factory=dict)  # lines a rank printed in its place


def _group_positional(per_rank: dict[int, list[str]]) -> list[CollapsedLine]:
    """Collapse short runs of lines that only some ranks printed, position by position."""
    out: list[CollapsedLine] = []
    depth = max((len(v) for v in per_rank.values()), default=0)
    for k in range(depth):
        by_text: dict[str, list[int]] = {}
        for rank in sorted(per_rank):
            lines = per_rank[rank]
            if k < len(lines):
                by_text.setdefault(lines[k], []).append(rank)
        for text, ranks in sorted(by_text.items(), key=lambda kv: kv[1][0]):
            out.append(CollapsedLine(ranks=ranks, text=text, uniform=False))
    return out


MATCH_LIMIT = 40_000
"""Largest (reference lines × rank lines) region difflib aligns; beyond, lines are paired by position.

difflib is quadratic on output full of repeated lines (progress dots, identical log lines); a
common prefix and suffix are stripped first, so this only bites when ranks truly diverge at length.
"""

Opcode = tuple[str, int, int, int, int]


def _align(ref: list[str], other: list[str]) -> list[Opcode]:
    """difflib-style opcodes turning ``ref`` into ``other``, bounded in time."""
    n, m = len(ref), len(other)
    pre = 0
    while pre < n and pre < m and ref[pre] == other[pre]:
        pre += 1
    suf = 0
    while suf < n - pre and suf < m - pre and ref[n - 1 - suf] == other[m - 1 - suf]:
        suf += 1
    ops: list[Opcode] = []
    if pre:
        ops.append(("equal", 0, pre, 0, pre))
    a_end, b_end = n - suf, m - suf
    mid_a, mid_b = a_end - pre, b_end - pre
    if mid_a * mid_b <= MATCH_LIMIT:
        matcher = SequenceMatcher(None, ref[pre:a_end], other[pre:b_end], autojunk=False)
        ops.extend(
            (tag, i1 + pre, i2 + pre, j1 + pre, j2 + pre) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        )
    else:
        k = min(mid_a, mid_b)
        for i in range(k):
            same = ref[pre + i] == other[pre + i]
            ops.append(("equal" if same else "replace", pre + i, pre + i + 1, pre + i, pre + i + 1))
        if mid_a > k:
            ops.append(("delete", pre + k, a_end, pre + k, pre + k))
        elif mid_b > k:
            ops.append(("insert", pre + k, pre + k, pre + k, b_end))
    if suf:
        ops.append(("equal", a_end, n, b_end, m))
    return ops


def collapse_rank_lines(lines_by_rank: dict[int, list[str]]) -> list[CollapsedLine]:
    """Merge every rank's lines into one ordered list, identical lines collapsed.

    The lowest rank is the reference. Each other rank is aligned to it with
    ``difflib.SequenceMatcher`` (bounded: see ``MATCH_LIMIT``); a reference line printed by every rank becomes
    one ``uniform`` line, lines a rank printed instead of (or in addition to)
    the reference follow at that point, grouped across ranks that printed the
    same thing. Output is in reference order, and within a point in rank order.
    """
    ranks = sorted(lines_by_rank)
    if not ranks:
        return []
    ref_rank = ranks[0]
    ref = list(lines_by_rank[ref_rank])
    slots = [_Slot(ranks=[ref_rank]) for _ in ref]
    tail = _Slot()  # lines printed after the reference's last line
    every = set(ranks)

    cache: dict[tuple[str, ...], list[Opcode]] = {}  # ranks that printed the same thing align once
    for rank in ranks[1:]:
        other = list(lines_by_rank[rank])
        key = tuple(other)
        if key not in cache:
            cache[key] = _align(ref, other)
        for tag, i1, i2, j1, j2 in cache[key]:
            if tag == "equal":
                for k in range(i2 - i1):
                    slots[i1 + k].ranks.append(rank)
            elif tag == "insert":
                target = slots[i1] if i1 < len(slots) else tail
                target.before.setdefault(rank, []).extend(other[j1:j2])
            elif tag == "replace":
                n = min(i2 - i1, j2 - j1)
                for k in range(n):
                    slots[i1 + k].instead.setdefault(rank, []).append(other[j1 + k])
                if j2 - j1 > n:  # the rank printed more lines than it replaced: keep them with the last one
                    slots[i1 + n - 1].instead.setdefault(rank, []).extend(other[j1 + n : j2])
            # "delete": the rank lacks these reference lines; the slot simply does not list it.

    out: list[CollapsedLine] = []
    for i, slot in enumerate(slots):
        out.extend(_group_positional(slot.before))
        out.append(CollapsedLine(ranks=sorted(slot.ranks), text=ref[i], uniform=set(slot.ranks) == every))
        out.extend(_group_positional(slot.instead))
    out.extend(_group_positional(tail.before))
    return out
