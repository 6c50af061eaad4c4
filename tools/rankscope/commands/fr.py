"""`rankscope fr DIR|FILES... [--stacks REPORT.json] [--json]`: diagnose from flight-recorder dumps."""

from __future__ import annotations

import argparse

from rankscope.commands.base import Command, add_json_flag, emit


class FlightCommand(Command):
    name = "fr"
    help = (
        "analyse flight-recorder dumps (NCCL/Gloo, pickle or JSON): the first collective where ranks disagree"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "paths", nargs="+", metavar="DIR|FILE", help="dump directory or per-rank dump files"
        )
        parser.add_argument(
            "--stacks",
            metavar="REPORT.json",
            default=None,
            help="merge a live `rankscope stacks --json` report",
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope import api

        report = api.analyze_flight_recorder(list(args.paths), stacks_report=args.stacks)
        emit(report, bool(args.json), full=args.full, brief=args.brief)
        return 0


COMMANDS = [FlightCommand]
