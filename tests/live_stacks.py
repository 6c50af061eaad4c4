"""Helpers of the tests on live hung jobs: poll a job's stacks until the verdict the test expects
shows (ranks may still be on their way to their blocking call) instead of assuming it after a fixed
sleep, and run the CLI in-process."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

from rankscope import cli
from rankscope.api import dump_stacks
from rankscope.models.core import StacksReport
from rankscope.options import DEFAULTS, DumpOptions
from tests.jobs import wait_for

READY_S = 180.0
"""Readiness can take long when the 2 cores are shared: every rank imports torch."""


def settle(
    pid: int, until: Callable[[StacksReport], bool], timeout: float = 90.0, options: DumpOptions = DEFAULTS
) -> StacksReport:
    """Dump until ``until(report)`` holds (ranks may still be on their way to the blocking call)."""
    box: list[StacksReport] = []

    def ok() -> bool:
        box[:] = [dump_stacks(pid, options)]
        return until(box[0])

    def last() -> str:
        return f"the last verdict: {box[0].verdict}" if box else "no capture answered"

    wait_for(ok, timeout, "the expected verdict", 0.3, last)
    return box[0]


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``rankscope ARGV`` in this process: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()
