"""The condition a collective is called under, read from the source lines above its call site.

A collective under ``if dist.get_rank() == 0:`` runs on one rank only: that branch is the
cause of the hang, and quoting it saves the agent opening the file. A collective under a
data-dependent condition (``if torch.isfinite(loss):``) or after an early ``continue`` runs on
the ranks whose data allow it. The shell reads the lines (the files are on the job's host);
this module only reads the text it is given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rankscope.analysis.hang.frames import is_user_frame
from rankscope.models.core import CallSite, Frame

LOOK_BACK = 12
"""Source lines read above a call site for its enclosing condition."""

GuardKind = Literal["rank", "data"]

_RANK = re.compile(
    r"get_rank\(|\b(global_|local_|node_|group_)?rank\b|is_main_process|is_rank_zero|is_master|is_global_zero|"
    r"is_local_main_process|process_index|rank_zero|\bRANK\b|is_main\b|is_leader|is_first_rank|is_last_rank"
)
_DATA = re.compile(
    r"isfinite|isnan|isinf|\.numel\(\)|\blen\(|is None|is not None|\.any\(\)|\.all\(\)|\bskip|\bempty\b|"
    r"\bnan\b|overflow|found_inf|"
    # a rank's own numbers: a loss or metric against a target, an early stop decided per rank
    r"\w*loss\b|\bval_\w+|metric|\bacc\w*|score|patience|\bbest_|converged|should_stop|early_stop"
)
_HEADER = re.compile(r"^(if|elif|while)\s+(?P<cond>.+?):\s*(#.*)?$")


@dataclass(frozen=True)
class Guard:
    """The block header a call site sits in, and what it tests."""

    kind: GuardKind
    line: int
    text: str

    @property
    def condition(self) -> str:
        """The tested expression alone: ``rank == 0`` of ``if rank == 0:  # save``."""
        m = _HEADER.match(self.text)
        return m.group("cond") if m is not None else self.text

    def phrase(self, file: str, what: str, site_line: int | None) -> str:
        return f"{file}:{self.line} `{self.text}` guards the {what} at {file}:{site_line}"


def guard_kind(text: str) -> GuardKind | None:
    """What a quoted condition tests: a rank (checked first: ``if rank == 0 and loss.isnan()`` runs
    on one rank), data, or neither."""
    cond = text.split("`")[1] if text.count("`") >= 2 else text
    if _RANK.search(cond):
        return "rank"
    if _DATA.search(cond):
        return "data"
    return None


def indent(text: str) -> int:
    """A source line's indentation, in characters: what nests it in the block above."""
    return len(text) - len(text.lstrip(" \t"))


def guard_of(site: CallSite | None, source: Mapping[tuple[str, int], str]) -> Guard | None:
    """The nearest enclosing ``if``/``elif``/``while`` of the call site, when it tests a rank or data.

    ``source`` maps (file, line) to the raw text of that line (indentation kept). An ``else:``
    is followed up to its ``if``: the branch runs where that condition is false, which is as
    rank- or data-dependent as the condition itself, unless the other branch makes the same call
    (``if rank == 0: schedule.step(x) else: schedule.step()``, a pipeline's first stage feeding
    the input): then every rank calls it and the condition only picks the arguments.
    """
    if site is None or site.line is None:
        return None
    call = source.get((site.file, site.line))
    if call is None:
        return None
    level = indent(call)
    else_line: int | None = None
    for lineno in range(site.line - 1, max(0, site.line - LOOK_BACK) - 1, -1):
        text = source.get((site.file, lineno))
        if text is None or not text.strip() or text.lstrip().startswith("#"):
            continue
        if indent(text) >= level:
            continue
        level = indent(text)
        stripped = text.strip()
        if stripped.startswith("else"):
            level += 1  # climb on to the matching if/elif, at this same indentation
            else_line = else_line or lineno
            continue
        m = _HEADER.match(stripped)
        if m is None:
            return None  # a def, for, with or try: the call is not under a condition here
        if else_line is not None and _same_call(call, site.file, range(lineno + 1, else_line), source):
            return None
        cond = m.group("cond")
        if _RANK.search(cond):
            return Guard("rank", lineno, stripped)
        if _DATA.search(cond):
            return Guard("data", lineno, stripped)
        return None
    return None


_CALLEE = re.compile(r"([A-Za-z_][\w.]*)\s*\(")


def _same_call(call: str, file: str, lines: range, source: Mapping[tuple[str, int], str]) -> bool:
    """Whether one of ``lines`` calls what the ``call`` line calls (``schedule.step``)."""
    m = _CALLEE.search(call)
    if m is None:
        return False
    callee = re.compile(rf"(?<![\w.]){re.escape(m.group(1))}\s*\(")
    return any(callee.search(source.get((file, n), "")) for n in lines)


USER_FRAMES = 3
"""User frames searched for a guard, innermost first: ``if rank == 0: sync_metrics()`` guards the
barrier inside ``sync_metrics`` from one frame out."""


def stack_guard(
    frames: Sequence[Frame],
    source: Mapping[tuple[str, int], str],
    shared: frozenset[tuple[str, int]] = frozenset(),
) -> tuple[Guard, CallSite] | None:
    """The first rank or data condition around the innermost user frames, with the frame it guards.

    Frames in ``shared`` (file, line) are on every rank's stack: a condition there is passed by
    all ranks alike (``if "RANK" in os.environ: main()``) and cannot explain why they split.
    """
    seen = 0
    for frame in frames:
        if not is_user_frame(frame) or frame.line is None or (frame.file, frame.line) in shared:
            continue
        site = CallSite(file=frame.file, line=frame.line, function=frame.function)
        guard = guard_of(site, source)
        if guard is not None:
            return guard, site
        seen += 1
        if seen >= USER_FRAMES:
            break
    return None


__all__ = ["LOOK_BACK", "USER_FRAMES", "Guard", "guard_kind", "guard_of", "indent", "stack_guard"]
