"""`rankscope triage PATH... [--json]`: findings from logs, and the rank to blame."""

from __future__ import annotations

import argparse

from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.render.triage import render_triage


class TriageCommand(Command):
    name = "triage"
    help = "triage logs (files, per-rank log directories, '-' for stdin, error.json) into findings and suspect ranks"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "paths", nargs="+", metavar="PATH", help="log files, directories, error.json, or '-' for stdin"
        )
        parser.add_argument(
            "--max-findings", type=int, default=50, help="at most this many findings (default 50)"
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope import api

        report = api.triage_logs(list(args.paths), max_findings=int(args.max_findings))
        if args.json and not args.full:
            from rankscope.analysis.bound import bound_triage

            report = bound_triage(report)
        emit(report, bool(args.json), render_triage, full=args.full)
        return 0


COMMANDS = [TriageCommand]
