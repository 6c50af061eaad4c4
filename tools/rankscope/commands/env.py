"""`rankscope env [--pid PID] [--json]`: the node, each rank's environment, and what is wrong with them."""

from __future__ import annotations

import argparse

from rankscope.commands.base import Command, add_json_flag, emit


class EnvCommand(Command):
    name = "env"
    help = "node facts (OS, memory, /dev/shm, torch/CUDA/NCCL, GPUs, Xid, network) and, with --pid, each rank's environment diffed"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--pid", type=int, default=None, help="a rank or launcher pid of a live job on this host"
        )
        parser.add_argument(
            "--no-torch", action="store_true", help="skip the torch probe (a subprocess importing torch)"
        )
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        from rankscope import api

        report = api.collect_env(args.pid, include_torch=not bool(args.no_torch))
        emit(report, bool(args.json), full=args.full, brief=args.brief)
        return 0


COMMANDS = [EnvCommand]
