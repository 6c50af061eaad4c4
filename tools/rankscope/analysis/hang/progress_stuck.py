"""The loop a rank stands in with nothing moving, its condition, and the values that condition reads.

A rank that polls for a file that never appears (``while not os.path.exists(p): pass``) burns CPU
at one line; over a short window that is no different from a long computation. Over a window long
enough, a rank whose every look stood inside one loop of its own code while no counter, no byte of
I/O and no local moved is stuck there, and what makes it so is the loop's condition: its header
(``while not os.path.exists(p)``) or the ``if ...: break`` in its body, and the locals it reads
(``p='/data/ready'``), read from the window's last look. The shell reads the source lines; this
module only reads the text it is given.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rankscope.analysis.hang.conditions import indent
from rankscope.analysis.hang.frames import is_internal_frame
from rankscope.analysis.hang.loops import LOOP_HEADER, Loop, enclosing_loops
from rankscope.analysis.hang.progress_signals import frame_values
from rankscope.models.core import Frame

LOOK_AHEAD = 20
"""Source lines read below a rank's own line, for the ``if ...: break`` of the loop it stands in."""

LOOP_FRAMES = 8
"""Own frames of a rank's last look searched for the loop it stands in, innermost first (and whose
surrounding lines the shell reads): the cost stays bounded however deep the stack."""

MAX_VALUES = 3
"""Values of a loop's condition quoted at most."""

MAX_VALUE = 160
"""Characters of one value quoted at most."""

_EXIT_IF = re.compile(r"^(el)?if\s+(?P<cond>.+?):\s*(?P<inline>(break|return|raise)\b.*)?(#.*)?$")
_EXIT = re.compile(r"^(break|return|raise)\b")
_NAME = re.compile(r"(?<![.\w'\"])([A-Za-z_]\w*)(?!\s*\()")
_OBJECT = re.compile(r"^<.*>$")


@dataclass(frozen=True)
class StuckLoop:
    """The loop every look of a rank stood in, the conditions that would end it, what they read."""

    loop: Loop
    conditions: tuple[str, ...]
    values: dict[str, str]

    @property
    def at(self) -> str:
        """``poll.py:40 `while not os.path.exists(p)```."""
        return f"{self.loop.at} `{self.loop.header}`"


def _own(frames: Sequence[Frame]) -> list[Frame]:
    return [f for f in frames if not f.native and f.file and f.line is not None and not is_internal_frame(f)]


def loop_of(frame: Frame, source: Mapping[tuple[str, int], str]) -> Loop | None:
    """The loop a frame's line is in: the line itself when it is a loop's header (``while not
    ready(p):`` spins at its header), else the innermost loop around it."""
    text = source.get((frame.file, frame.line)) if frame.line is not None else None
    if text is not None and LOOP_HEADER.match(text.strip()):
        return Loop(frame.file, frame.function, frame.line or 0, text.strip())
    loops = enclosing_loops(frame, source)
    return loops[0] if loops else None


def _inside(frame: Frame, loop: Loop, source: Mapping[tuple[str, int], str]) -> bool:
    if frame.file != loop.file or frame.function != loop.function:
        return False
    return frame.line == loop.line or loop in enclosing_loops(frame, source)


def _turns(loop: Loop, stacks: Sequence[Sequence[Frame]], source: Mapping[tuple[str, int], str]) -> bool:
    """Whether every look stood in the loop and the loop itself turns: the looks saw it at its header
    (a ``while`` condition that spins), at more than one of its lines, or with nothing of the job's
    own below it. A loop whose body stands in one call all along (a training loop around an endless
    evaluation) is not where the rank spins: the call is."""
    lines: set[int] = set()
    innermost = True
    for stack in stacks:
        own = _own(stack)
        at = next((i for i, g in enumerate(own) if _inside(g, loop, source)), None)
        if at is None:
            return False
        lines.add(own[at].line or 0)
        innermost = innermost and at == 0
    if loop.line in lines or len(lines) > 1:
        return True
    return innermost and _body(loop, source) == lines  # ``while True: poll()``: one statement, turning


def _body(loop: Loop, source: Mapping[tuple[str, int], str]) -> set[int]:
    """The lines of the loop's body that do work (up to :data:`LOOK_AHEAD` lines read): code, but not
    the ``break``/``return``/``continue``/``pass`` a spinning loop never reaches or never stands at."""
    header = source.get((loop.file, loop.line))
    if header is None:
        return set()
    found: set[int] = set()
    for n in range(loop.line + 1, loop.line + LOOK_AHEAD + 1):
        text = source.get((loop.file, n))
        if text is None or (text.strip() and indent(text) <= indent(header)):
            break
        code = text.strip()
        if (
            code
            and not code.startswith("#")
            and not _EXIT.match(code)
            and code not in ("pass", "continue", "...")
        ):
            found.add(n)
    return found


def _exits(loop: Loop, source: Mapping[tuple[str, int], str]) -> list[str]:
    """The conditions of the ``if ...: break``/``return``/``raise`` directly in the loop's body."""
    header = source.get((loop.file, loop.line))
    if header is None:
        return []
    level = indent(header)
    found: list[str] = []
    lines = [(n, source.get((loop.file, n))) for n in range(loop.line + 1, loop.line + LOOK_AHEAD + 1)]
    for i, (_, text) in enumerate(lines):
        if text is None or (text.strip() and indent(text) <= level):
            break
        m = _EXIT_IF.match(text.strip())
        if m is None:
            continue
        following = next((t for _, t in lines[i + 1 :] if t and t.strip()), None)
        if m.group("inline") or (
            following is not None and indent(following) > indent(text) and _EXIT.match(following.strip())
        ):
            found.append(m.group("cond"))
    return found


def _names(conditions: Sequence[str]) -> list[str]:
    """The names a condition reads (``p`` of ``not os.path.exists(p)``), in order, once each."""
    out: list[str] = []
    for cond in conditions:
        for name in _NAME.findall(re.sub(r"(['\"]).*?\1", "", cond)):
            if not keyword.iskeyword(name) and name not in ("True", "False", "None") and name not in out:
                out.append(name)
    return out


def condition_values(conditions: Sequence[str], values: Mapping[str, str]) -> dict[str, str]:
    """The values of the locals the conditions read, objects without a value of their own left out."""
    out: dict[str, str] = {}
    for name in _names(conditions):
        value = values.get(name)
        if value is None or _OBJECT.match(value):
            continue
        out[name] = value if len(value) <= MAX_VALUE else value[: MAX_VALUE - 1] + "…"
        if len(out) >= MAX_VALUES:
            break
    return out


def stuck_loop(
    stacks: Sequence[Sequence[Frame]],
    last: Sequence[Frame],
    reprs: Mapping[str, str],
    source: Mapping[tuple[str, int], str],
) -> StuckLoop | None:
    """The loop of its own code that every look of a rank (``stacks``: its samples and dumps) stood
    in, found from the frames of its last look, innermost first; None when its looks left every loop
    (or the lines around them could not be read). ``reprs``: the last look's locals."""
    if not stacks:
        return None
    for frame in _own(last)[:LOOP_FRAMES]:
        loop = loop_of(frame, source)
        if loop is not None and _turns(loop, stacks, source):
            m = LOOP_HEADER.match(loop.text)
            head = m.group("head") if m is not None else loop.text
            if m is not None and m.group("kw") == "for":
                head = head.split(" in ", 1)[-1]
            conditions = tuple(c for c in (head, *_exits(loop, source)) if c.strip() != "True")
            values = condition_values(conditions, frame_values(reprs, loop.file, loop.function))
            return StuckLoop(loop=loop, conditions=conditions, values=values)
    return None


def lines_around(frames: Sequence[Frame], back: int, ahead: int = LOOK_AHEAD) -> set[tuple[str, int]]:
    """The (file, line) of the source a look's own frames (the innermost :data:`LOOP_FRAMES`) need for
    their loops: ``back`` lines above each, ``ahead`` below."""
    wanted: set[tuple[str, int]] = set()
    for f in _own(frames)[:LOOP_FRAMES]:
        line = f.line or 0
        wanted.update((f.file, n) for n in range(max(1, line - back), line + ahead + 1))
    return wanted


__all__ = ["StuckLoop", "condition_values", "lines_around", "loop_of", "stuck_loop"]
