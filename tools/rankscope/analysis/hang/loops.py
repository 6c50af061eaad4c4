"""The loop one stack is still in and another has left, read from the source above their frames.

The most common DDP hang is uneven inputs: one rank's data loader runs out a batch early, the
rank leaves its training loop and waits in the next collective (an evaluation barrier), while the
others wait in their last step's gradient all-reduce. The stacks show only where each waits; the
loop header above the others' frame (``for step, batch in enumerate(loader):``) and their loop
counter (``step=31``) say why, and point the fix at the data, not at the barrier. The shell reads
the lines; this module only reads the text it is given.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rankscope.analysis.hang.conditions import Guard, guard_of, indent
from rankscope.analysis.hang.frames import is_internal_frame, parting
from rankscope.models.core import CallSite, Frame

LOOP_LOOK_BACK = 60
"""Source lines read above a user frame for the loops around it: a training step's body is often
a few dozen lines."""

LOOP_LOOK_AHEAD = 40
"""Source lines read below a user frame: the rest of the loop's body, where a ``break`` one rank took
in an earlier iteration (an early stop it decided alone) stands below the line the others wait on."""

LOOP_HEADER = re.compile(r"^(async\s+)?(?P<kw>for|while)\s+(?P<head>.+?):\s*(#.*)?$")
_STOP = re.compile(r"^(async\s+)?(def|class)\s")
_TARGET = re.compile(r"^\(?\s*([A-Za-z_]\w*)")
_EXIT = re.compile(r"^(continue|break|return)\b")


@dataclass(frozen=True)
class Loop:
    """A ``for``/``while`` header around a frame's line, and the function it is in."""

    file: str
    function: str
    line: int
    text: str

    @property
    def at(self) -> str:
        """``train.py:99``."""
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def header(self) -> str:
        """The header without its colon and comment: ``for step, (x, y) in enumerate(loader)``."""
        m = LOOP_HEADER.match(self.text)
        return f"{m.group('kw')} {m.group('head')}" if m is not None else self.text

    @property
    def counter(self) -> str | None:
        """The first name a ``for`` binds (``step`` of ``for step, (x, y) in ...``): the loop's count
        when it enumerates, which the progress counters hold per rank."""
        m = LOOP_HEADER.match(self.text)
        if m is None or m.group("kw") != "for":
            return None
        target = m.group("head").split(" in ", 1)[0]
        name = _TARGET.match(target.strip())
        return name.group(1) if name is not None else None

    @property
    def counter_key(self) -> str | None:
        """Where the progress counters keep this loop's count: ``train.py:train_epoch:step``."""
        return f"{os.path.basename(self.file)}:{self.function}:{self.counter}" if self.counter else None

    def count(self, counters: Mapping[str, int]) -> int | None:
        """This loop's count in one rank's counters, when they hold it."""
        key = self.counter_key
        return counters.get(key) if key is not None else None


def enclosing_loops(frame: Frame, source: Mapping[tuple[str, int], str]) -> list[Loop]:
    """The loops around a frame's line in its own function, innermost first.

    Walks up the lines whose indentation is less than the last one's, to the ``def``; a line not
    read (outside the lines read, or a file not on this host) ends the walk with what it found.
    """
    if frame.line is None or (frame.file, frame.line) not in source:
        return []
    level = indent(source[(frame.file, frame.line)])
    found: list[Loop] = []
    for lineno in range(frame.line - 1, max(0, frame.line - LOOP_LOOK_BACK) - 1, -1):
        text = source.get((frame.file, lineno))
        if text is None:
            break
        if not text.strip() or text.lstrip().startswith("#") or indent(text) >= level:
            continue
        level = indent(text)
        stripped = text.strip()
        if _STOP.match(stripped):
            break
        if LOOP_HEADER.match(stripped):
            found.append(Loop(frame.file, frame.function, lineno, stripped))
        if level == 0:
            break
    return found


@dataclass(frozen=True)
class Exit:
    """A ``continue``, ``break`` or ``return`` in a loop's body before a stack's line, and the rank
    or data condition it sits under (``if loss.isnan(): continue``), when one is read."""

    file: str
    line: int
    statement: str
    guard: Guard | None

    @property
    def at(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def guard_at(self) -> str | None:
        """``train.py:46``: the line of the condition it sits under."""
        return f"{os.path.basename(self.file)}:{self.guard.line}" if self.guard is not None else None


def early_exits(loop: Loop, before: int, source: Mapping[tuple[str, int], str]) -> list[Exit]:
    """The exits of ``loop`` between its header and line ``before``: the ways a rank leaves an
    iteration (or the loop) before the collectives the others are in. A ``break`` or ``continue`` of
    a nested loop is not one of them."""
    found: list[Exit] = []
    for lineno in range(loop.line + 1, before):
        text = source.get((loop.file, lineno))
        m = _EXIT.match(text.strip()) if text is not None else None
        if m is None:
            continue
        here = Frame(function=loop.function, file=loop.file, line=lineno)
        inner = enclosing_loops(here, source)
        if m.group(1) != "return" and (not inner or inner[0] != loop):
            continue
        site = CallSite(file=loop.file, line=lineno, function=loop.function)
        found.append(Exit(loop.file, lineno, m.group(1), guard_of(site, source)))
    return found


@dataclass(frozen=True)
class LoopLeft:
    """A loop the ``inside`` stack is in and the ``outside`` stack has left (or never entered)."""

    loop: Loop
    suspect_inside: bool
    """True when the suspects are the ones still in the loop (they run more iterations)."""
    exits: tuple[Exit, ...] = ()
    """The loop's exits above the line the inside stack stands on, guarded or not."""
    same_body: bool = False
    """Both are in this loop, the suspects at a later collective of its body: they skipped one
    earlier in the body (a guarded ``continue`` above the others' line), so they are one ahead."""

    @property
    def exit(self) -> Exit | None:
        """The exit that most likely split them: the nearest one under a rank or data condition."""
        return next((e for e in reversed(self.exits) if e.guard is not None), None)


def loop_left(
    suspect: Sequence[Frame],
    others: Sequence[Frame],
    source: Mapping[tuple[str, int], str],
    counters: tuple[Mapping[str, int], Mapping[str, int]] = ({}, {}),
) -> LoopLeft | None:
    """The loop that splits two stacks which part later in the same function.

    Where they part, the stack on the earlier line is the one inside: a loop around its line there
    that is not around the other's line, else the innermost loop of its first user frame below
    (a function the other has returned from); else, when both stand in the same loop with the
    suspect at the later line, a guarded exit of its body above the others' line (a skip inside the
    same loop: :func:`_skipped_in_body`). None when the stacks do not part that way, no loop
    is read there, or a loop around both counts differently on the two (``counters``: the
    suspect's, the others'): then they stand in different iterations of it, one behind, and no one
    ran out of the inner loop (rank 0 saving a checkpoint at step 40 while the others reduce
    gradients at step 41).
    """
    found = parting(list(suspect), list(others))
    if found is None:
        return None
    fa, fb = found
    if fa.line is None or fb.line is None or fa.line == fb.line:
        return None
    suspect_inside = fa.line < fb.line
    inner, outer = (fa, fb) if suspect_inside else (fb, fa)
    around_outer = enclosing_loops(outer, source)
    if any(_counts_differ(loop, counters) for loop in around_outer):
        return None
    around_inner = enclosing_loops(inner, source)
    here = [loop for loop in around_inner if loop not in around_outer]
    if here:
        return _left(here[0], inner, suspect_inside, source)
    stack = suspect if suspect_inside else others
    for frame in _below(list(stack), inner):
        loops = [] if is_internal_frame(frame) else enclosing_loops(frame, source)
        if loops:
            return _left(loops[0], frame, suspect_inside, source)
    if not suspect_inside and around_inner and around_inner[0] in around_outer:
        return _skipped_in_body(around_inner[0], inner, source)
    return None


def _left(loop: Loop, at: Frame, suspect_inside: bool, source: Mapping[tuple[str, int], str]) -> LoopLeft:
    exits = early_exits(loop, at.line, source) if at.line is not None else []
    if at.line is not None and not any(e.guard is not None for e in exits):
        exits += later_exits(loop, at.line, source)
    return LoopLeft(loop, suspect_inside, tuple(exits))


def later_exits(loop: Loop, after: int, source: Mapping[tuple[str, int], str]) -> list[Exit]:
    """The ``break``/``return`` statements of ``loop``'s body below line ``after``: a rank that took
    one in an earlier iteration left the loop while the others went round again to ``after``
    (``if val_loss < target: break`` decided on each rank's own numbers). The body ends at the first
    line indented no deeper than the header, or at a line not read."""
    found: list[Exit] = []
    level = indent(source.get((loop.file, loop.line), ""))
    for lineno in range(after + 1, after + LOOP_LOOK_AHEAD + 1):
        text = source.get((loop.file, lineno))
        if text is None:
            break
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if indent(text) <= level:
            break
        m = _EXIT.match(stripped)
        if m is None or m.group(1) == "continue":
            continue
        here = Frame(function=loop.function, file=loop.file, line=lineno)
        if m.group(1) == "break" and enclosing_loops(here, source)[:1] != [loop]:
            continue  # the break of a nested loop
        site = CallSite(file=loop.file, line=lineno, function=loop.function)
        found.append(Exit(loop.file, lineno, m.group(1), guard_of(site, source)))
    return found


def _skipped_in_body(loop: Loop, earlier: Frame, source: Mapping[tuple[str, int], str]) -> LoopLeft | None:
    """The suspects stand at a later line of the same loop body than the others: a guarded exit of
    that body above the others' line sent them past it once (``if torch.isnan(x).any(): continue``
    above the all_reduce), so they issued one collective fewer and now wait at a later one. None
    when no such exit is read: then nothing in the body says why."""
    exits = tuple(e for e in early_exits(loop, earlier.line or 0, source) if e.statement != "return")
    if not any(e.guard is not None for e in exits):
        return None
    return LoopLeft(loop, suspect_inside=False, exits=exits, same_body=True)


def _counts_differ(loop: Loop, counters: tuple[Mapping[str, int], Mapping[str, int]]) -> bool:
    mine, theirs = loop.count(counters[0]), loop.count(counters[1])
    return mine is not None and theirs is not None and mine != theirs


def _below(frames: list[Frame], at: Frame) -> list[Frame]:
    """The frames called from ``at`` (innermost last: the nearest callee first)."""
    python = [f for f in frames if not f.native]
    if at not in python:
        return []
    return list(reversed(python[: python.index(at)]))


__all__ = [
    "LOOP_HEADER",
    "LOOP_LOOK_AHEAD",
    "LOOP_LOOK_BACK",
    "Exit",
    "Loop",
    "LoopLeft",
    "early_exits",
    "enclosing_loops",
    "later_exits",
    "loop_left",
]
