"""`rankscope placements PATH`: what is sharded, how, and whether the pieces fit together."""

from __future__ import annotations

import argparse

from rankscope.commands.base import Command, add_json_flag, emit


class PlacementsCommand(Command):
    name = "placements"
    help = "show how a DCP checkpoint or saved placement reports shard each tensor; find gaps and overlaps"
    description = (
        "Read a torch.distributed.checkpoint directory (.metadata: global size, chunk offsets/sizes and storage "
        "file per tensor) or the placements-rank<R>.json files written by rankscope.probe.dump(model, DIR, "
        "kind='placements'). Reports sharded vs whole tensors, bytes per file, and chunks that overlap or leave gaps. "
        "Exit status: 0 no problems, 1 problems found, 2 bad input."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "path", metavar="PATH", help="DCP checkpoint directory, or placement report file/directory"
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope.api import inspect_placements

        report = inspect_placements(str(args.path))
        emit(report, bool(args.json), full=args.full, brief=args.brief)
        return 1 if report.problems else 0


COMMANDS = [PlacementsCommand]
