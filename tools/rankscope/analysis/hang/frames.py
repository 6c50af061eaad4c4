"""Frames: which are the job's own code, which thread is the main one, where a rank stands.

Pure helpers shared by the stacks analysis (recognition, grouping) and the verdict rules.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from rankscope.analysis.code_origin import NOT_OWN, frame_origin
from rankscope.models.core import CallSite, Frame, RankStack, ThreadStack

STUCK_STATES: frozenset[str] = frozenset({"stopped", "tracing_stop", "disk_sleep"})
GONE_STATES: frozenset[str] = frozenset({"zombie", "dead"})
NO_PTRACE_STATES: frozenset[str] = frozenset({"stopped", "tracing_stop"}) | GONE_STATES
"""States py-spy must not attach to: a stopped process would block it, a gone one has no stack."""

# -- frames ------------------------------------------------------------------------------------


def is_generated_frame(frame: Frame) -> bool:
    """True for a frame of code that torch.compile generated (inductor's ``Runner.call``)."""
    return frame_origin(frame) == "generated"


def is_user_frame(frame: Frame) -> bool:
    """True for a Python frame in the job's own code (not torch, another library, rankscope, the
    stdlib, or code torch.compile generated), told by where its code comes from
    (:mod:`rankscope.analysis.code_origin`), never by a word in its path."""
    return frame_origin(frame) == "user"


def is_internal_frame(frame: Frame) -> bool:
    """True for a frame of torch, rankscope or the standard library: its locals and loops say
    nothing of the job (a third-party training loop's, a Trainer's ``fit``, do)."""
    return frame_origin(frame) in NOT_OWN


def main_thread(stack: RankStack) -> ThreadStack | None:
    """The thread the analysis starts from: py-spy's main thread, else MainThread by name."""
    if not stack.threads:
        return None
    picks: tuple[Callable[[ThreadStack], bool], ...] = (
        lambda t: t.is_main,
        lambda t: t.os_thread_id is not None and t.os_thread_id == stack.pid,
        lambda t: t.name == "MainThread",
    )
    for pick in picks:
        for thread in stack.threads:
            if pick(thread):
                return thread
    return stack.threads[0]


def find_call_site(frames: Iterable[Frame]) -> CallSite | None:
    """The innermost user frame: where the job's own code called into the library."""
    for frame in frames:
        if is_user_frame(frame):
            return CallSite(file=frame.file, line=frame.line, function=frame.function)
    return None


def short_path(path: str) -> str:
    """A library file from its package on (``torch/distributed/distributed_c10d.py``); any other
    file unchanged (the job's own files keep their full path, which the agent opens)."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def is_torch_or_stdlib(frame: Frame) -> bool:
    """True for a frame of torch or of Python's standard library."""
    return frame_origin(frame) in ("torch", "stdlib")


def lib_where(frame: Frame) -> str:
    """``torch/distributed/distributed_c10d.py:3252``: a library frame without the install prefix."""
    path = frame.file.replace("\\", "/")
    short = short_path(path)
    path = short if short != path else (os.path.basename(path) or path)
    return f"{path}:{frame.line}" if frame.line is not None else path


def blocked_in(frames: list[Frame]) -> str | None:
    """The library call the user code is waiting in (``Queue.get``), for a rank in no collective.

    That is the outermost non-user Python frame inside the innermost user frame.
    """
    last: Frame | None = None
    for frame in frames:
        if frame.native:
            continue
        if is_user_frame(frame):
            break
        last = frame
    else:
        return None
    return f"{last.function} ({lib_where(last)})" if last is not None else None


def short_site(site: CallSite | None) -> str:
    """``train.py:21`` (basename and line) for summaries."""
    if site is None:
        return "an unknown site"
    base = os.path.basename(site.file) or site.file
    return f"{base}:{site.line}" if site.line is not None else base


def parting(suspect: list[Frame], others: list[Frame]) -> tuple[Frame, Frame] | None:
    """Where one stack leaves another: the deepest Python frame both run (same function and file,
    compared from the outermost in), as (the suspect's frame there, the others' frame there).

    Their lines there differ, or the calls below them do. That frame may be library code (a
    Trainer's ``fit``) where the user's call site is one ``trainer.fit()`` line for both.
    """
    a = [f for f in reversed(suspect) if not f.native]
    b = [f for f in reversed(others) if not f.native]
    found: tuple[Frame, Frame] | None = None
    for fa, fb in zip(a, b, strict=False):
        if (fa.function, fa.file) != (fb.function, fb.file):
            break
        found = (fa, fb)
        if fa.line != fb.line:
            break
    return found
