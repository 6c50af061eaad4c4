"""`rankscope compare DIR`: which tensors differ between the files each rank saved."""

from __future__ import annotations

import argparse

from rankscope.commands.base import Command, add_json_flag, emit


class CompareCommand(Command):
    name = "compare"
    help = "ranks disagree: compare what each rank saved (checkpoints, optimizer states, probe dumps); the cause first"
    description = (
        "Compare what each rank saved in DIR: torch.save'd checkpoints, state_dicts or optimizer states "
        "(rank in the file name, e.g. model_rank3.pt, optim_rank3.pt, or a rank3/ folder), or the "
        "fingerprints-rank<R>.json files of rankscope.probe.dump(model, DIR). The first line names the "
        "rank and the cause it can see: a step counter behind the others', a file of another run or model, "
        "keys some ranks lack, a file much older than the others', NaN/Inf; then the tensors that differ "
        "from the majority. With no per-rank file it says what to add to a live job. Exit status: 0 "
        "consistent, 1 differences or problems found, 2 bad input or nothing to compare."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "dir",
            metavar="DIR",
            nargs="?",
            default=".",
            help="the folder the ranks saved to, or the job's folder with one such folder in it (default: here); with nothing saved, says what to add to the job",
        )
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
