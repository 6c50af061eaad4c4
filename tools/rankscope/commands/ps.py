"""``rankscope ps``: the distributed jobs on this host and their ranks."""

from __future__ import annotations

import argparse

from rankscope import api
from rankscope.commands.base import Command, add_json_flag, emit


class PsCommand(Command):
    name = "ps"
    help = "list the distributed PyTorch jobs on this host (launcher, world size, ranks)"
    description = (
        "Scan /proc for ranks of torchrun, torch.multiprocessing.spawn, srun, mpirun and RANK-setting "
        "launchers, and group them into jobs. DataLoader workers are shown as children of their rank."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--pid", type=int, help="only the job of this pid (a launcher or any rank)")
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        pid: int | None = args.pid
        as_json: bool = args.json
        jobs = api.list_jobs(pid)
        emit(jobs, as_json, full=args.full, brief=args.brief)
        return 0


COMMANDS = [PsCommand]
