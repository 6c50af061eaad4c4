"""Python tracebacks in a log: where the error was raised, and what ended a dead thread.

An error message says what failed; the traceback printed with it says where in the user's code.
Per (source, rank) this keeps only the innermost user frame of the traceback being printed (library
frames say nothing the user can change), so a finding can name its call site. A thread that died
("Exception in thread ...") is told by the exception that closes its traceback: that line is handed
back so the scanner can complete the thread's finding. faulthandler's stacks ("most recent call
first") mark a source as holding stacks, which the shell then reads as saved stacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rankscope.analysis.code_origin import origin_of

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S.*?)\s*$')
_EXCEPTION_LINE = re.compile(
    r"^(?P<exception>[A-Za-z_][\w.]*(?:Error|Exception)\w*)(?:: (?P<exc_message>.*))?$"
)
_TRACE_SPAN = 60
"""A user frame more than this many lines before an error is not that error's traceback."""
COLLECTIVE_STACK = "Stack trace of the failed collective"
"""NCCL's watchdog (torch >= 2.10) prints the timed-out collective's Python stack under this line."""
_COLLECTIVE_FRAME = re.compile(r"^#(?P<n>\d+) (?P<func>\S+) from (?P<file>.+?\.py):(?P<line>\d+)\s*$")
_STACK_SPAN = 16
"""The collective's frames follow their header within this many lines."""

Where = tuple[str, int | None]
"""(source, rank): one process's output, where one traceback is printed at a time."""


@dataclass(frozen=True)
class ThreadEnd:
    """The exception line that closed a dead thread's traceback."""

    thread: str
    exception: str
    message: str | None
    """The exception's message as printed (not redacted, not cut); None when it has none."""
    call_site: str | None


class Tracebacks:
    """The traceback being printed per (source, rank), and the dead threads still waiting for theirs."""

    def __init__(self) -> None:
        self._frames: dict[Where, tuple[int, str]] = {}
        self._threads: dict[Where, str] = {}
        self._collective: dict[str, tuple[int | None, int]] = {}
        self.stack_sources: set[str] = set()
        """Sources that hold faulthandler stacks ("most recent call first"): saved stacks as well as logs."""

    def read(self, text: str, line_no: int, source: str, rank: int | None) -> bool:
        """Follow a traceback's header or frame line; True when the line is that and nothing more."""
        if "(most recent call first)" in text:
            self.stack_sources.add(source)
            return True
        if "Traceback (most recent call last)" in text:
            self._frames.pop((source, rank), None)
            return True
        fm = _FRAME.match(text)
        if fm is not None:
            if origin_of(fm["file"]) == "user":
                self._frames[(source, rank)] = (line_no, f"{fm['file']}:{fm['line']} in {fm['func']}")
            return True
        return False

    def collective_frame(
        self, text: str, line_no: int, source: str, rank: int | None
    ) -> tuple[int | None, str] | bool:
        """Follow NCCL's "Stack trace of the failed collective" (its frames carry no rank prefix): True
        for its header or a frame said nothing new, (rank, call site) for its innermost user frame,
        which the rank's timeout then names; False for any other line."""
        if COLLECTIVE_STACK in text:
            self._collective[source] = (rank, line_no)
            return True
        fm = _COLLECTIVE_FRAME.match(text.strip())
        pending = self._collective.get(source)
        if fm is None or pending is None or line_no - pending[1] > _STACK_SPAN:
            return False
        if origin_of(fm["file"]) != "user":
            return True
        del self._collective[source]  # the innermost user frame is the call site; the rest say less
        return pending[0], f"{fm['file']}:{fm['line']} in {fm['func']}"

    def call_site(self, source: str, rank: int | None, line_no: int) -> str | None:
        """The innermost user frame of the traceback just printed on this rank, if recent enough."""
        seen = self._frames.get((source, rank))
        return seen[1] if seen is not None and line_no - seen[0] <= _TRACE_SPAN else None

    def watch_thread(self, source: str, rank: int | None, thread: str) -> None:
        """A thread died here: the next exception line on this rank closes its traceback."""
        self._threads[(source, rank)] = thread

    def thread_end(self, text: str, line_no: int, source: str, rank: int | None) -> ThreadEnd | None:
        """The exception that ends a dead thread's traceback, when ``text`` is it (the thread is then done)."""
        thread = self._threads.get((source, rank))
        em = _EXCEPTION_LINE.match(text.strip()) if thread is not None else None
        if thread is None or em is None:
            return None
        del self._threads[(source, rank)]
        return ThreadEnd(
            thread=thread,
            exception=em["exception"],
            message=em["exc_message"],
            call_site=self.call_site(source, rank, line_no),
        )
