"""`rankscope triage PATH... [--json]`: findings from logs, and the rank to blame."""

from __future__ import annotations

import argparse

from rankscope.commands.base import Command, add_json_flag, emit


class TriageCommand(Command):
    name = "triage"
    help = (
        "one verdict for a dead job from what it left (logs, torchrun's log folder, error.json, "
        "flight-recorder dumps, saved stacks; a folder is enough, '-' for stdin); a watch folder "
        "leads with its capture of the stall"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "paths",
            nargs="+",
            metavar="PATH",
            help="files or folders: logs, error.json, recorder dumps, saved stacks, a watch folder, the job's "
            "script, or '-' for stdin",
        )
        parser.add_argument(
            "--max-findings", type=int, default=50, help="at most this many findings (default 50)"
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope import api

        report = api.triage_logs(list(args.paths), max_findings=int(args.max_findings))
        emit(report, bool(args.json), full=args.full, brief=args.brief)
        return 0


COMMANDS = [TriageCommand]
