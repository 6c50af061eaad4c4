"""`rankscope compare DIR`: which tensors differ between the files each rank saved."""

from __future__ import annotations

import argparse

from rankscope.commands.base import Command, add_json_flag, emit


class CompareCommand(Command):
    name = "compare"
    help = (
        "compare per-rank fingerprint files or torch.save'd state_dicts: which tensors differ on which ranks"
    )
    description = (
        "Compare the fingerprints-rank<R>.json files written by rankscope.probe.dump(model, DIR), or one "
        "torch.save'd state_dict per rank (rank in the file name, e.g. model_rank3.pt). Reports the tensors "
        "that differ from the majority, NaN/Inf per rank, keys present on some ranks only, and files that "
        "come from different jobs. Exit status: 0 consistent, 1 differences or problems found, 2 bad input."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dir", metavar="DIR", help="directory with one file per rank")
        parser.add_argument(
            "--atol", type=float, default=0.0, help="absolute tolerance on sum/abs-max (default: exact bytes)"
        )
        parser.add_argument(
            "--rtol", type=float, default=0.0, help="relative tolerance on sum/abs-max (default: exact bytes)"
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope.api import compare_dir

        report = compare_dir(str(args.dir), atol=float(args.atol), rtol=float(args.rtol))
        emit(report, bool(args.json), full=args.full, brief=args.brief)
        return 0 if report.consistent else 1


COMMANDS = [CompareCommand]
