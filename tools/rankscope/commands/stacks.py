"""``rankscope stacks``: every rank's stack at once, grouped, with a verdict.

Exit codes: 0 whenever a report was produced, whatever the verdict (a hang is a
finding, not a failure of rankscope; scripts read ``verdict.kind`` from ``--json``);
2 for errors (no such pid, not a distributed job, py-spy missing, permission
denied). A rank that exits during capture is a per-rank error inside the report.
"""

from __future__ import annotations

import argparse
import dataclasses

from rankscope import api
from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.options import DEFAULT_TIMEOUT_S, DEFAULT_WINDOW_S, VIAS, DumpOptions, StacksTarget


class StacksCommand(Command):
    name = "stacks"
    help = "dump all ranks' stacks at once and name the rank that diverged"
    description = (
        "Run py-spy on every rank of a job concurrently, find the collective each rank waits in and its "
        "call site, group the ranks and give a verdict (mismatched_collectives, divergent_ranks, "
        "missing_ranks, all_in_same_collective, no_collective, inconclusive) with next steps. "
        "Exit 0 when a report was produced, 2 on errors."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--pid",
            type=int,
            help="a launcher (torchrun, mp.spawn parent) or any rank; default: the only job here",
        )
        parser.add_argument(
            "--native", action="store_true", help="include C/C++ frames (slower: symbol loading)"
        )
        parser.add_argument("--locals", action="store_true", help="include local variables (redacted)")
        parser.add_argument(
            "--nonblocking", action="store_true", help="do not pause the ranks while sampling"
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT_S,
            help=f"seconds per rank (default {DEFAULT_TIMEOUT_S:g})",
        )
        parser.add_argument(
            "--window",
            type=float,
            default=DEFAULT_WINDOW_S,
            metavar="SECONDS",
            help=f"watch the job this long before naming anyone (default {DEFAULT_WINDOW_S:g}; 0: one look): a job "
            "whose counters or lines move is reported as progressing, straggler or busy, never as hung; widen it "
            "for long steps",
        )
        parser.add_argument(
            "--no-counters",
            dest="counters",
            action="store_false",
            help="do not read progress counters (step, epoch: integer locals) in a second pass when the "
            "first verdict is not sure",
        )
        parser.add_argument(
            "--no-fr",
            dest="flight_recorder",
            action="store_false",
            help="do not read the collective state: by default the recorder dumps this run's ranks already wrote "
            "are analysed with the stacks, ranks that opened a channel for one (TORCH_NCCL_DEBUG_INFO_PIPE_FILE, "
            "rankscope.probe.enable_flight_recorder, a worker socket; torch's debug server when the verdict is "
            "unsure) are asked for one while training goes on, and an NCCL job's TCPStore exception_dump key is "
            "read (never written)",
        )
        parser.add_argument(
            "--ras",
            action="store_true",
            help="also read NCCL RAS (NCCL >= 2.24, localhost:28028 or NCCL_RAS_ADDR): each rank's launch counts, "
            "twice 3 s apart, which name the rank behind. Off by default: querying RAS has crashed jobs on NCCL "
            "2.26-2.29 (NVIDIA/nccl#2346), so it is skipped while a rank creates a communicator",
        )
        parser.add_argument(
            "--rank",
            type=int,
            action="append",
            dest="ranks",
            metavar="N",
            help="only these ranks (repeatable)",
        )
        _add_saved_arguments(parser)
        _add_remote_arguments(parser)
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        pid: int | None = args.pid
        options = DumpOptions.from_values(args)  # the flags' destinations are the option's field names
        target, job_id = _target(args)
        api.check_stacks_call(pid=pid, ranks=args.ranks, target=target, from_paths=args.from_paths)
        if args.from_paths is not None:
            backend = None if args.backend == "auto" else args.backend
            report = api.stacks_from_files(args.from_paths, backend=backend)
        elif target.remote:
            report = api.dump_stacks_remote(target, options, pid=pid)
        else:
            report = api.dump_stacks(pid, options, ranks=args.ranks, job_id=job_id)
        # --local answers a fan-out from another host, which merges whole reports
        as_json, full = bool(args.json or args.local), bool(args.full or args.local)
        emit(report, as_json, full=full, brief=args.brief, full_ranks=args.ranks)
        return 0


def _target(args: argparse.Namespace) -> tuple[StacksTarget, str | None]:
    """Where the ranks are, and which job of this host: the one ``--job`` names the Slurm job or the
    pods' job when the call reaches other hosts (``StacksTarget.remote``), a job of this host
    otherwise. ``--local`` (a fan-out's call on one of its hosts) stays on this host."""
    if args.local:
        return StacksTarget(), args.job
    where = StacksTarget(
        hosts=None if args.hosts is None else (args.hosts,),
        via=args.via,
        namespace=args.namespace,
        rankscope_cmd=args.rankscope_cmd,
    )
    if where.remote:
        return api.slurm_target(dataclasses.replace(where, job=args.job)), None
    if args.from_paths is None:  # a plain call on a Slurm cluster: a Slurm job's nodes, or this host
        slurm = api.slurm_target(where, pid=args.pid, job_id=args.job, ranks=args.ranks)
        if slurm.remote:
            return slurm, None
    return where, args.job


def _add_saved_arguments(parser: argparse.ArgumentParser) -> None:
    saved = parser.add_argument_group("saved stacks (the job is gone)")
    saved.add_argument(
        "--from",
        dest="from_paths",
        nargs="+",
        metavar="PATH",
        help="analyse saved stacks instead of a live job: py-spy dumps (text or --json, one file per rank "
        "named rank3/rank_3/stacks_rank_3...), faulthandler output, or a torchrun log with [rankN]: prefixes",
    )
    saved.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="the job's backend when the files do not show it (auto: read it from native frames)",
    )


def _add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    remote = parser.add_argument_group("several hosts")
    remote.add_argument(
        "--hosts",
        help="comma-separated hosts to collect from (runs `rankscope stacks --local --json` there)",
    )
    remote.add_argument(
        "--via",
        choices=VIAS,
        default="ssh",
        help="how to reach the hosts: ssh (needs --hosts); srun, kubectl and debug-server find the "
        "job's hosts themselves (the Slurm job's nodes, the pods of --job, MASTER_ADDR:MASTER_PORT) "
        "when --hosts is left out; debug-server takes --hosts MASTER_ADDR:PORT",
    )
    remote.add_argument(
        "--job",
        help="this host: the job id to inspect when several run here (rankscope ps lists them); with --via: "
        "the SLURM job id (srun) or pod selector (kubectl)",
    )
    remote.add_argument("--namespace", help="Kubernetes namespace (--via kubectl)")
    remote.add_argument(
        "--rankscope-cmd",
        default="rankscope",
        metavar="CMD",
        help="how to run rankscope on the other hosts (default: rankscope; e.g. /opt/venv/bin/rankscope)",
    )
    remote.add_argument(
        "--local", action="store_true", help="only this host (JSON for merging by a collecting host)"
    )


COMMANDS = [StacksCommand]
