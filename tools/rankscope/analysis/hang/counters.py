"""Progress counters: integer locals (step, epoch, i, ...) compared across ranks.

A rank whose loop counter differs from the majority's is behind (or ahead): it skipped or
added an iteration, ran out of data first, or took a rank-dependent branch. This holds on
NCCL and gloo alike, and on NCCL it is often the only CPU-side evidence that names the
laggard, because every rank's CPU stops at some GPU wait. Only integer values are kept
from the locals; every other local is dropped before anything leaves the shell.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rankscope.analysis.hang.frames import is_internal_frame, is_user_frame
from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.core import Confidence, Frame, LocalVar, RankStack

KNOWN_COUNTERS: tuple[str, ...] = (
    "global_step",
    "step",
    "steps",
    "iteration",
    "iter",
    "it",
    "epoch",
    "batch_idx",
    "batch_index",
    "micro_step",
    "microbatch",
    "micro_batch",
    "update",
    "i",
)
"""Names that count progress, best first: a split on one of these decides."""

_RANKISH = re.compile(
    r"(^|_)(rank|ranks|world|world_size|size|device|device_id|gpu|gpu_id|cuda|pid|port|seed|node|stage|shard|"
    r"local_world_size|num_workers|workers|dim|ndim|numel|nbytes|dtype|len|length|count|total)($|_)"
)
"""Integers that differ by rank by design (its rank, device, shard) or say nothing about progress."""

_INT = re.compile(r"-?\d{1,18}")

MAX_COUNTERS_PER_RANK = 32


def counter_key(frame: Frame, name: str) -> str:
    """``train.py:main:step``: file basename, function and local name."""
    return f"{os.path.basename(frame.file)}:{frame.function}:{name}"


def _where(key: str) -> tuple[str, str]:
    """(``main (train.py)``, ``step``) from a counter key."""
    parts = key.rsplit(":", 2)
    if len(parts) == 3:
        return f"{parts[1]} ({parts[0]})", parts[2]
    function, name = key.rsplit(":", 1) if ":" in key else ("?", key)
    return function, name


def int_locals(frames: Iterable[Frame]) -> dict[str, int]:
    """``file:function:name`` -> value for the integer locals of the frames worth comparing.

    Frames of torch and the standard library are skipped (their integers are internal); the
    job's own frames and third-party training loops (a Trainer's ``fit``) are kept.
    """
    out: dict[str, int] = {}
    for frame in frames:
        if frame.native or not frame.locals or is_internal_frame(frame):
            continue
        for local in frame.locals:
            value = _int_value(local)
            if value is None or _RANKISH.search(local.name.lower()):
                continue
            out.setdefault(counter_key(frame, local.name), value)
            if len(out) >= MAX_COUNTERS_PER_RANK:
                return out
    return out


def _int_value(local: LocalVar) -> int | None:
    text = (local.repr or "").strip()
    return int(text) if _INT.fullmatch(text) else None


_C10D = "torch/distributed/distributed_c10d.py"
_LOGGER = "torch/distributed/c10d_logger.py"
_PG = re.compile(r"ProcessGroup( object)? at ")
"""A ProcessGroup as py-spy shows it (``<torch._C._distributed_c10d.ProcessGroup at 0x...>``)."""
_GROUP_NONE = re.compile(r"""["']group["']:\s*None""")


def on_subgroup(frames: Iterable[Frame]) -> bool | None:
    """Whether the c10d call a thread waits in runs on a subgroup. None when the locals cannot tell.

    The call's own ``group`` local does not say: c10d replaces a ``None`` argument with the default
    group before it waits (``if group is None: group = _get_default_group()``), so a ProcessGroup
    there may be the world. What the caller passed does say, and c10d's logging wrapper around
    every collective (``_exception_logger``) holds it in its ``args`` and ``kwargs``: no group
    passed, or ``group=None``, is the default group; a ProcessGroup the job's own code passed is a
    subgroup. A ProcessGroup a library passed is not known to be one: libraries pass the group they
    hold, which is the world unless the job gave them another (ZeRO's ``process_group`` defaults to
    ``dist.group.WORLD``), so that says nothing either way.
    """
    frames = [f for f in frames if not f.native]
    for i, frame in enumerate(frames):
        if not frame.file.replace("\\", "/").endswith(_LOGGER) or not frame.locals:
            continue
        values = {v.name: (v.repr or "") for v in frame.locals}
        if "kwargs" not in values and "args" not in values:
            continue
        kwargs, args = values.get("kwargs", ""), values.get("args", "")
        if _GROUP_NONE.search(kwargs):
            return False
        if not (_PG.search(kwargs) or _PG.search(args)):
            return False
        caller = frames[i + 1] if i + 1 < len(frames) else None
        return True if caller is not None and is_user_frame(caller) else None
    for frame in frames:  # no wrapper with locals: only an explicit None in the call decides
        if not frame.file.replace("\\", "/").endswith(_C10D) or not frame.locals:
            continue
        group = next((v.repr for v in frame.locals if v.name == "group"), None)
        if group is not None and group.strip() in ("None", ""):
            return False
        if group is not None:
            return None
    return None


@dataclass(frozen=True)
class CounterSplit:
    """Ranks whose counter differs from the majority's, and the sentence that says so."""

    key: str
    suspects: list[int]
    confidence: Confidence
    summary: str
    evidence: str


def counter_split(stacks: Sequence[RankStack]) -> CounterSplit | None:
    """The best disagreement among the ranks' counters, or None when they agree (or say nothing).

    A counter decides when a strict majority (at least two ranks) shares one value and the
    others differ; a counter equal to the rank number on every rank is the rank, not progress.
    Known counter names (step, epoch, i) are preferred to other integers.
    """
    by_key: dict[str, dict[int, int]] = {}
    for s in stacks:
        if s.rank is None:
            continue
        for key, value in s.counters.items():
            by_key.setdefault(key, {})[s.rank] = value
    candidates: list[tuple[int, int, CounterSplit]] = []
    for key, values in by_key.items():
        split = _split(key, values)
        if split is not None:
            name = _where(key)[1].lower()
            rank_of_name = KNOWN_COUNTERS.index(name) if name in KNOWN_COUNTERS else len(KNOWN_COUNTERS)
            candidates.append((rank_of_name, len(split.suspects), split))
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1], c[2].key))
    return candidates[0][2]


def _split(key: str, values: dict[int, int]) -> CounterSplit | None:
    if len(values) < 3 or len(set(values.values())) < 2:
        return None
    if all(v == r for r, v in values.items()):
        return None  # the rank itself
    counts = Counter(values.values())
    (top, n_top), *rest = counts.most_common()
    if n_top < 2 or (rest and rest[0][1] == n_top) or n_top * 2 <= len(values):
        return None
    suspects = sorted(r for r, v in values.items() if v != top)
    majority = sorted(r for r, v in values.items() if v == top)
    function, name = _where(key)
    odd = Counter(values[r] for r in suspects)
    parts = [
        f"{ranks_phrase(sorted(r for r in suspects if values[r] == v))}: {name}={v}"
        for v, _ in odd.most_common()
    ]
    text = f"{'; '.join(parts)} in {function}; {ranks_phrase(majority)}: {name}={top}"
    known = name.lower() in KNOWN_COUNTERS
    confidence: Confidence = "high" if known and len(odd) == 1 and len(suspects) < len(majority) else "medium"
    return CounterSplit(
        key=key,
        suspects=suspects,
        confidence=confidence,
        summary=f"progress counters differ: {text}",
        evidence=f"progress counter {name} in {function}: {text}",
    )
