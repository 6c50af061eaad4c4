"""`rankscope run`: launch a script under torchrun, stream every rank, catch hangs and crashes."""

from __future__ import annotations

import argparse
import sys

from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.models.run import RunReport

EXIT_CRASHED = 1
EXIT_HUNG = 3
EXIT_TIMEOUT = 124
"""Exit statuses of `rankscope run` (0: every rank finished; 2: bad arguments; 130: interrupted)."""


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
        emit(report, as_json, full=args.full, brief=args.brief)
        return exit_status(report)


COMMANDS = [RunCommand]
