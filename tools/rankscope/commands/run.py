"""`rankscope run`: launch a script under torchrun, stream every rank, catch hangs and crashes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from rankscope.commands.base import Command, add_json_flag, emit, render_next_steps
from rankscope.models.core import StacksReport
from rankscope.models.run import RunReport

EXIT_CRASHED = 1
EXIT_HUNG = 3
EXIT_TIMEOUT = 124
"""Exit statuses of `rankscope run` (0: every rank finished; 2: bad arguments; 130: interrupted)."""


def _render_stacks(stacks: StacksReport) -> Iterator[str]:
    from rankscope.analysis.collapse import rank_label

    v = stacks.verdict
    suspects = f" (suspect ranks: {', '.join(map(str, v.suspect_ranks))})" if v.suspect_ranks else ""
    yield f"verdict: {v.kind}{suspects}"
    yield f"  {v.summary}"
    for line in v.evidence:
        yield f"  - {line}"
    for group in stacks.groups:
        where = f" at {group.call_site}" if group.call_site else ""
        op = group.op or (f"state {group.state}" if group.state else "no collective")
        yield f"  {rank_label(group.ranks) if group.ranks else 'no ranks'}: {op}{where}"
        for frame in group.frames[:8]:
            yield f"      {frame.function} ({frame.where()})"
    for err in stacks.errors:
        yield f"  capture error on rank {err.rank} (pid {err.pid}): {err.message}"
    yield from render_next_steps(v.next_steps, indent="  ")


def render_run(report: RunReport) -> Iterator[str]:
    """The end-of-run summary printed after the streamed output."""
    from rankscope.analysis.collapse import render_collapsed

    yield ""
    yield f"== rankscope run: {report.outcome} =="
    if report.collapsed_stdout:
        yield "-- stdout, all ranks (identical lines collapsed; '!' = not the same on every rank) --"
        yield from render_collapsed(report.collapsed_stdout)
    if report.collapsed_stderr:
        yield "-- stderr, all ranks --"
        yield from render_collapsed(report.collapsed_stderr)
    for e in report.failed_ranks:
        how = e.signal or f"exit code {e.exit_code}"
        first = " (first failure)" if e.root_cause else ""
        detail = f": {e.detail}" if e.detail and not e.detail.startswith("Signal ") else ""
        yield f"rank {e.rank}: {how}{first}{detail}"
    if report.outcome == "hung" and report.hang_evidence:
        yield f"hang: {report.hang_evidence}"
    if report.stacks is not None:
        yield from _render_stacks(report.stacks)
    for note in report.notes:
        yield f"note: {note}"
    yield report.summary
    shown = report.stacks.verdict.next_steps if report.stacks is not None else []
    yield from render_next_steps([s for s in report.next_steps if s not in shown])


def exit_status(report: RunReport) -> int:
    if report.outcome == "ok":
        return 0
    if report.outcome == "hung":
        return EXIT_HUNG
    if report.outcome == "timeout":
        return EXIT_TIMEOUT
    return report.exit_code if report.exit_code not in (None, 0, 2) else EXIT_CRASHED


class RunCommand(Command):
    name = "run"
    help = (
        "run a script on N ranks under torchrun; stream each rank, catch hangs (stacks + verdict) and crashes"
    )
    description = (
        "Launch SCRIPT under torchrun on this host and stream every rank's output with a [rankN] prefix. "
        "When no rank prints anything for --hang-timeout seconds and the ranks are idle, rankscope captures "
        "every rank's stack and a verdict, then terminates the whole job. Ends with the output of all ranks "
        "collapsed (identical lines once). Exit status: 0 all ranks finished, 1 a rank crashed (named), "
        "3 hung, 124 --timeout passed, 130 interrupted. Ranks get RANKSCOPE_BACKEND=gloo when this host has "
        "no NVIDIA GPU (nccl otherwise)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--nproc", "--nproc-per-node", type=int, default=2, metavar="N", help="ranks to start (default 2)"
        )
        parser.add_argument(
            "--hang-timeout",
            type=float,
            default=60.0,
            metavar="S",
            help="seconds without output (ranks idle) before it counts as a hang; 0 turns hang detection off (default 60)",
        )
        parser.add_argument(
            "--timeout", type=float, default=None, metavar="S", help="stop the job after S seconds in all"
        )
        parser.add_argument(
            "--python", default=None, metavar="EXE", help="interpreter of the training environment"
        )
        add_json_flag(parser)
        parser.add_argument("script", help="the training script (put `--` before it)")
        parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")

    def run(self, args: argparse.Namespace) -> int:
        from rankscope.api import run_job

        as_json = bool(args.json)
        script_args = [str(a) for a in args.script_args]  # argparse already consumed the `--` before SCRIPT
        hang = float(args.hang_timeout) if args.hang_timeout else None
        report = run_job(
            str(args.script),
            script_args,
            nproc=int(args.nproc),
            hang_timeout=hang,
            timeout=args.timeout,
            stream=sys.stderr if as_json else sys.stdout,  # --json keeps stdout for the answer alone
            python=args.python,
        )
        emit(report, as_json, render_run)
        return exit_status(report)


COMMANDS = [RunCommand]
