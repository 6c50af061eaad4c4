"""``print_all_ranks``: every rank's output in rank order, identical lines collapsed.

The folklore version loops ``for r in range(world): if rank == r: print(); barrier()``:
world_size barriers in a row, output still interleaved by the terminal, and a
rank that skips the loop hangs everyone. Here each rank formats its lines,
one gather brings them to every rank, and the lowest rank of the group prints
the collapsed listing (``ranks 0-6: loss 1.23`` / ``! rank 7: loss nan``).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rankscope.analysis.collapse import collapse_rank_lines, render_collapsed
from rankscope.probe import _dist


def format_all_ranks(*objs: Any, group: Any = None, sep: str = " ") -> list[str]:
    """Gather the printed form of ``objs`` from every rank; the collapsed lines, the same on every rank."""
    text = sep.join(str(o) for o in objs)
    gathered = _dist.gather_objects(text.splitlines() or [""], group)
    return render_collapsed(collapse_rank_lines({int(r): list(v) for r, v in gathered.items()}))


def print_all_ranks(
    *objs: Any, group: Any = None, file: TextIO | None = None, sep: str = " ", all_print: bool = False
) -> list[str]:
    """Print ``objs`` from every rank of ``group`` as one ordered, collapsed listing.

    Every rank of the group must call it (one gather, with the probe timeout).
    The lowest rank of the group prints (``all_print=True``: every rank does);
    every rank gets the lines back.
    """
    lines = format_all_ranks(*objs, group=group, sep=sep)
    me, _ = _dist.rank_and_world(group)
    if all_print or me == _dist.group_ranks(group)[0]:
        out = file or sys.stdout
        out.write("\n".join(lines) + "\n")
        out.flush()
    return lines
