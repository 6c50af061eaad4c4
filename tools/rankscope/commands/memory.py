"""``rankscope memory``: memory per rank (live or snapshots), and ``rankscope memory budget``.

Forms::

    rankscope memory --pid PID [--json]            live job: nvidia-smi + /proc per rank
    rankscope memory PATH... [--top N] [--json]    snapshot pickles or a directory of per-rank files
    rankscope memory budget PLACEMENT.json [--optimizer adam] [--param-dtype bf16] [--gpu-memory 80GiB]

``budget`` as the first PATH selects the budget (a snapshot file literally
named ``budget`` can be passed as ``./budget``).
"""

from __future__ import annotations

import argparse

from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.errors import InvalidInput


def _add_budget_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("budget options")
    g.add_argument(
        "--optimizer",
        default="adam",
        help="adam, adamw, sgd, adagrad, rmsprop, lion, none, or states per element",
    )
    g.add_argument(
        "--param-dtype", default="float32", help="dtype parameters are stored in (float32, bf16, ...)"
    )
    g.add_argument("--grad-dtype", default=None, help="gradient dtype (default: the param dtype)")
    g.add_argument("--optim-dtype", default="float32", help="optimizer state dtype")
    g.add_argument(
        "--gpu-memory", default=None, help="memory per GPU, e.g. 80GiB, to say whether each plan fits"
    )
    g.add_argument(
        "--world-size", type=int, default=None, help="ranks sharing the model (when the input does not say)"
    )


def _run_budget(args: argparse.Namespace, placement: str) -> int:
    from rankscope import api

    report = api.memory_budget(
        placement,
        optimizer=args.optimizer,
        param_dtype=args.param_dtype,
        grad_dtype=args.grad_dtype,
        optim_dtype=args.optim_dtype,
        gpu_memory=args.gpu_memory,
        world_size=args.world_size,
    )
    emit(report, args.json, full=args.full, brief=args.brief)
    return 0


class MemoryCommand(Command):
    name = "memory"
    help = "memory per rank: live job (--pid), CUDA snapshot files, or `memory budget PLACEMENT.json`"
    description = (
        "Live job: GPU memory per rank (nvidia-smi) and host RSS/shared memory/DataLoader workers, with imbalance "
        "flagged. Snapshot files (torch.cuda.memory._dump_snapshot, one per rank or a directory): peak, allocated vs "
        "reserved, fragmentation vs exhaustion, top allocation sites, leak suspects. `rankscope memory budget "
        "PLACEMENT.json` gives per-rank bytes of a sharding plan."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "paths",
            nargs="*",
            metavar="PATH",
            help="snapshot files or directories; or `budget PLACEMENT.json`",
        )
        parser.add_argument(
            "--pid", type=int, default=None, help="a rank or launcher pid of a live job (rankscope ps)"
        )
        parser.add_argument(
            "--top", type=int, default=10, help="allocation sites listed per snapshot (default 10)"
        )
        add_json_flag(parser)
        _add_budget_options(parser)

    def run(self, args: argparse.Namespace) -> int:
        paths: list[str] = list(args.paths)
        if paths and paths[0] == "budget":
            if len(paths) != 2:
                raise InvalidInput(
                    "`rankscope memory budget` takes exactly one placement file",
                    fix="rankscope memory budget placement.json --gpu-memory 80GiB",
                )
            return _run_budget(args, paths[1])
        from rankscope import api

        report = api.inspect_memory(args.pid, paths or None, top=args.top)
        emit(report, args.json, full=args.full, brief=args.brief)
        return 0


COMMANDS = [MemoryCommand]
