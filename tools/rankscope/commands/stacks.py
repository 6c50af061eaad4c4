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
from rankscope.errors import InvalidInput
from rankscope.options import DEFAULT_TIMEOUT_S, DEFAULT_WINDOW_S, VIAS, DumpOptions, StacksTarget, host_pid


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
            type=_pid,
            metavar="[HOST:]PID",
            help="a launcher (torchrun, mp.spawn parent) or any rank; HOST:PID: one on another host, whose job "
            "is then inspected on every host of --hosts; default: the job started in the current folder, or the "
            "only job",
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
            "whose counters, I/O or lines move is reported as progressing, straggler or busy, never as hung; over "
            "10 s or more, a rank that only goes round one loop of its own with nothing else moving is stuck there; "
            "widen it for long steps",
        )
        parser.add_argument(
            "--no-counters",
            dest="counters",
            action="store_false",
            help="do not read progress counters (step, epoch: integer locals; from the window's last look, "
            "or a second pass with --window 0)",
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
        _add_rank_arguments(parser)
        _add_saved_arguments(parser)
        _add_remote_arguments(parser)
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        if args.ambiguous_ranks is not None:
            raise InvalidInput(
                "--rank is gone: it named two things (show a rank's stacks, capture only that rank)",
                fix="Pass --show-rank N for more of the same answer (MCP: full_ranks), or --only-rank N to "
                "capture only rank N (MCP: ranks; the verdict then covers that rank alone).",
            )
        pid_host, pid = args.pid if args.pid is not None else (None, None)
        options = DumpOptions.from_values(args)  # the flags' destinations are the option's field names
        target, job_id = _target(args, pid_host)
        api.check_stacks_call(
            pid=pid,
            ranks=args.ranks,
            target=target,
            full_ranks=args.show_ranks,
            from_paths=args.from_paths,
            last=args.last,
        )
        if args.local:
            # a host of a multi-host call: its evidence, judged with the other hosts' by the caller
            look = api.look_here(pid, options, job_id=job_id, here=args.here)
            emit(look, True, full=True)
            return 0
        if args.last:
            report = api.last_capture()
        elif args.from_paths is not None:
            backend = None if args.backend == "auto" else args.backend
            report = api.stacks_from_files(args.from_paths, backend=backend)
            api.save_capture(report, partial=True)
        else:
            report = api.live_stacks(
                target, options, pid=pid, pid_host=pid_host, ranks=args.ranks, job_id=job_id
            )
        emit(report, bool(args.json), full=bool(args.full), brief=args.brief, full_ranks=args.show_ranks)
        return 0


def _pid(text: str) -> tuple[str | None, int]:
    """``PID`` or ``HOST:PID`` (a launcher or rank on another host)."""
    try:
        return host_pid(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _add_rank_arguments(parser: argparse.ArgumentParser) -> None:
    """Two flags for two meanings: more of one answer (--show-rank), a smaller capture (--only-rank)."""
    parser.add_argument(
        "--show-rank",
        type=int,
        action="append",
        dest="show_ranks",
        metavar="N",
        help="show rank N's whole stack in --brief/--json (repeatable; MCP: full_ranks); with --last, "
        "of the capture already answered",
    )
    parser.add_argument(
        "--last",
        action="store_true",
        help="answer again from the last capture (kept in $RANKSCOPE_CACHE_DIR or ~/.cache/rankscope) "
        "instead of capturing: more of the same answer, never a new verdict (MCP: last=true)",
    )
    parser.add_argument(
        "--only-rank",
        type=int,
        action="append",
        dest="ranks",
        metavar="N",
        help="capture only rank N (repeatable; MCP: ranks): the verdict covers those ranks alone and names "
        "the suspects of the last capture of every rank",
    )
    parser.add_argument("--rank", type=int, action="append", dest="ambiguous_ranks", help=argparse.SUPPRESS)


def _target(args: argparse.Namespace, pid_host: str | None) -> tuple[StacksTarget, str | None]:
    """Where the ranks are, and which job: ``--job`` names the Slurm job (srun) or the pods' job
    (kubectl), and otherwise the job id to inspect, on this host or on every host of ``--hosts``.
    ``--local`` (a fan-out's call on one of its hosts) stays on this host. A ``HOST:PID`` adds its
    host to the hosts."""
    if args.local:
        return StacksTarget(), args.job
    hosts = args.hosts
    if pid_host is not None:
        hosts = pid_host if hosts is None else f"{hosts},{pid_host}"
    where = StacksTarget(
        hosts=None if hosts is None else (hosts,),
        via=args.via,
        namespace=args.namespace,
        rankscope_cmd=args.rankscope_cmd,
    )
    if where.remote:
        return api.slurm_target(dataclasses.replace(where, job=args.job)), None
    if args.from_paths is None and not args.last:  # a plain call on a Slurm cluster: a Slurm job's nodes
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
        help="the job id to inspect when several run here or on --hosts (rankscope ps lists them); with "
        "--via srun / kubectl: the SLURM job id or pod selector",
    )
    remote.add_argument("--namespace", help="Kubernetes namespace (--via kubectl)")
    remote.add_argument(
        "--rankscope-cmd",
        default="rankscope",
        metavar="CMD",
        help="how to run rankscope on the other hosts (default: rankscope; e.g. /opt/venv/bin/rankscope)",
    )
    remote.add_argument(
        "--local",
        action="store_true",
        help="only this host, as one host of a multi-host call: its evidence as JSON, judged by the caller",
    )
    # the folder a multi-host call was made from: each host picks the job started there
    remote.add_argument("--here", help=argparse.SUPPRESS)


COMMANDS = [StacksCommand]
