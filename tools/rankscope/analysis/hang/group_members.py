"""Who belongs to the process group a rank waits on, read from the job's own locals.

py-spy shows a ProcessGroup only as an address (``<...ProcessGroup at 0x7f..>``), so the
group's members are not in the c10d frame. Two things in the caller's locals say them:

* **A table of groups.** Every rank calls ``new_group`` for every group, in the same order
  (c10d requires it), and gets back the ProcessGroup where it is a member and c10d's
  ``GroupMember.NON_GROUP_MEMBER`` (``-100``) where it is not. A list (or dict) the job keeps of
  them, e.g. ``pairs = [new_group([0, 1]), new_group([2, 3])]``, therefore reads
  ``[<ProcessGroup at 0xA>, -100]`` on rank 0 and ``[-100, <ProcessGroup at 0xB>]`` on rank 2:
  its entries are the same groups on every rank, and which ones hold a ProcessGroup says whether
  that rank is a member. The address of the group the collective runs on names its entry.
* **A list of ranks** the job keeps near the call (``pair_ranks = [2, 3]``), that holds the rank.

Only these facts are kept (:class:`GroupLocals`); every other local is dropped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from rankscope.analysis.hang.frames import is_internal_frame
from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.core import Frame, GroupLocals, RankStack

NON_GROUP_MEMBER = "-100"
"""c10d's ``GroupMember.NON_GROUP_MEMBER``: what ``new_group`` returns on a rank outside the group."""

_PG = re.compile(r"<[\w.]*ProcessGroup at (0x[0-9a-fA-F]+)>")
_C10D = "torch/distributed/distributed_c10d.py"
_RANK_LIST_NAME = re.compile(
    r"(^|_)(ranks?|groups?|members?|pairs?|peers?|pgs?|mesh|partners?|team|replicas?|nodes?)($|_)"
)
"""Names of a local that lists a group's ranks (``pair_ranks``, ``group``, ``tp_members``), word by word."""
_TABLE_MAX = 4096


def _split_top(inner: str) -> list[str]:
    """Items of a py-spy container repr, split on the commas at depth 0."""
    items: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(inner):
        if ch in "[({<":
            depth += 1
        elif ch in "])}>":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(inner[start:i].strip())
            start = i + 1
    tail = inner[start:].strip()
    if tail:
        items.append(tail)
    return items


def _items(text: str) -> list[str] | None:
    text = text.strip()
    if len(text) < 2 or text[0] + text[-1] not in ("[]", "()", "{}"):
        return None
    items = _split_top(text[1:-1])
    if text[0] == "{":
        values = [item.split(":", 1)[1].strip() if ":" in item else "" for item in items]
        return values
    return items


def group_table(text: str | None) -> list[str | None] | None:
    """The entries of a list/tuple/dict of process groups: each group's address, or None where the
    rank holds NON_GROUP_MEMBER. None when the value is not such a table (fewer than two entries,
    no ProcessGroup in it, or anything else among the entries)."""
    items = _items(text or "")
    if items is None or len(items) < 2 or len(items) > _TABLE_MAX:
        return None
    table: list[str | None] = []
    for item in items:
        if item == NON_GROUP_MEMBER:
            table.append(None)
            continue
        m = _PG.fullmatch(item)
        if m is None:
            return None
        table.append(m.group(1).lower())
    return table if any(a is not None for a in table) else None


def rank_list(text: str | None, rank: int, world: int | None) -> list[int] | None:
    """The ranks of a list the job keeps that holds ``rank``: a flat list of distinct ranks, or the
    one list holding ``rank`` in a list of them (``[[0, 1], [2, 3]]``)."""
    items = _items(text or "")
    if items is None or not items:
        return None
    if all(_items(i) is not None for i in items):
        found = [r for i in items if (r := rank_list(i, rank, world)) is not None]
        return found[0] if len(found) == 1 else None
    if not all(re.fullmatch(r"\d{1,7}", i) for i in items):
        return None
    ranks = [int(i) for i in items]
    if len(ranks) < 2 or len(set(ranks)) != len(ranks) or rank not in ranks:
        return None
    if world is not None and (max(ranks) >= world or len(ranks) >= world):
        return None
    return sorted(ranks)


def _key(frame: Frame, name: str) -> str:
    return f"{os.path.basename(frame.file)}:{frame.function}:{name}"


def waited_group(frames: Iterable[Frame]) -> str | None:
    """The address of the process group the innermost c10d call holds in its ``group`` local."""
    for frame in frames:
        if frame.native or not frame.locals or not frame.file.replace("\\", "/").endswith(_C10D):
            continue
        value = next((v.repr for v in frame.locals if v.name == "group"), None)
        if value is not None:
            m = _PG.fullmatch(value.strip())
            return m.group(1).lower() if m else None
    return None


def read_group_locals(frames: Sequence[Frame], rank: int | None, world: int | None) -> GroupLocals | None:
    """The group tables among a main thread's locals, the entry its collective's group is, and a
    list of ranks that holds this rank; None when its locals hold none of these."""
    waited = waited_group(frames)
    tables: dict[str, list[bool]] = {}
    slot: str | None = None
    lists: dict[tuple[int, ...], str] = {}
    for frame in frames:
        if frame.native or not frame.locals or is_internal_frame(frame):
            continue
        for local in frame.locals:
            key = _key(frame, local.name)
            table = group_table(local.repr)
            if table is not None:
                tables.setdefault(key, [a is not None for a in table])
                if slot is None and waited is not None and waited in table:
                    slot = f"{key}[{table.index(waited)}]"
                continue
            if rank is not None and _RANK_LIST_NAME.search(local.name.lower()):
                found = rank_list(local.repr, rank, world)
                if found is not None:
                    lists.setdefault(tuple(found), key)
    # two different lists of ranks (tp_ranks and dp_ranks) do not say which group the call runs on
    ranks, ranks_from = (
        (list(next(iter(lists))), next(iter(lists.values()))) if len(lists) == 1 else (None, None)
    )
    if not tables and ranks is None:
        return None
    return GroupLocals(tables=tables, slot=slot, ranks=ranks, ranks_from=ranks_from)


def _where(key: str) -> str:
    file, function, name = key.split(":", 2)
    return f"`{name}` in {function} ({file})"


def members(rank: int, stacks: Sequence[RankStack]) -> tuple[list[int], str, bool] | None:
    """The members of the group ``rank``'s collective runs on, how they were read, and whether the
    read is a group table (True) or a list of ranks (False). None when the locals do not say.

    A table decides only when every rank that was read holds it (a rank without it could be a
    member) and some rank holds NON_GROUP_MEMBER at that entry (else it is a list of each rank's
    own groups, whose entries differ from rank to rank).
    """
    mine = next((s.group_locals for s in stacks if s.rank == rank and s.group_locals is not None), None)
    if mine is None:
        return None
    if mine.slot is not None:
        key, index = mine.slot.rsplit("[", 1)
        i = int(index.rstrip("]"))
        read = [s for s in stacks if s.rank is not None and s.error is None and s.threads]
        held = {s.rank: s.group_locals.tables.get(key) for s in read if s.group_locals is not None}
        complete = len(held) == len(read) and all(t is not None and len(t) > i for t in held.values())
        # a table says who is *not* a member only where some rank holds NON_GROUP_MEMBER there; a list
        # of each rank's own groups (DeviceMesh.get_all_groups(), one per dimension) holds a
        # ProcessGroup everywhere, and its entries are different groups on different ranks
        if complete and any(t is not None and not t[i] for t in held.values()):
            found = sorted(r for r, t in held.items() if t is not None and t[i] and r is not None)
            evidence = (
                f"rank {rank}'s group is entry {i} of {_where(key)}: {ranks_phrase(found)} hold a ProcessGroup "
                f"there, the other ranks c10d's NON_GROUP_MEMBER (-100)"
            )
            return found, evidence, True
    if mine.ranks is not None and mine.ranks_from is not None:
        return mine.ranks, f"rank {rank}'s group is {mine.ranks}, read from {_where(mine.ranks_from)}", False
    return None


__all__ = ["group_table", "members", "rank_list", "read_group_locals", "waited_group"]
