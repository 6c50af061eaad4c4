"""`rankscope watch`: stay beside a running job; on a stall, capture what a live call would, before
the job's own timeout erases it. Exit 0 when the watch ended (the job ended, or it was stopped)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rankscope import api
from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.errors import InvalidInput
from rankscope.models.watch import WatchSelection
from rankscope.options import DEFAULT_TIMEOUT_S, DEFAULT_WINDOW_S


class WatchCommand(Command):
    name = "watch"
    help = "watch a running job from beside it; on a stall, capture its stacks before its timeout kills it"
    description = (
        "Attach to a job already running (chosen as `rankscope stacks` chooses it: the job started in this "
        "folder, --pid, --job) and watch it with /proc counters only (CPU, I/O, kernel waits, output size): "
        "nothing pauses the job between incidents. When no rank makes progress for --stall seconds (ranks idle; "
        "longer when they spin, as NCCL does), a second sample confirms it, then every rank's stacks, the "
        "recorder, the environment, GPU state and log tails are written to DIR/incidents/NNN-TIME/, well before "
        "the job's own collective timeout. A job that moves again marks the incident resumed. A torchrun "
        "restart is a new attempt of the same job. It stops when the job ends. Read the folder with "
        "`rankscope triage DIR`. With --detach it runs detached from the terminal (log: DIR/watcher.log)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--out", metavar="DIR", help="the watch folder (made 0700; required)")
        parser.add_argument("--detach", action="store_true", help="run detached; print the folder and pid")
        parser.add_argument(
            "--pid", type=int, help="a launcher or rank of the job (default: the job started here)"
        )
        parser.add_argument(
            "--job",
            help="the job id when several run here (rankscope ps lists them); with --via srun, the Slurm job",
        )
        parser.add_argument(
            "--hosts", help="watch every host from here (a login node): node1,node2 or node[01-04], over ssh"
        )
        parser.add_argument(
            "--via",
            choices=("ssh", "srun"),
            default=None,
            help="how the hosts are reached (srun: --job ID's nodes)",
        )
        parser.add_argument("--sampler", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--here", help=argparse.SUPPRESS)
        _seconds(parser, "--interval", "seconds between two /proc samples (default 2)")
        _seconds(
            parser,
            "--stall",
            "seconds without progress, ranks idle, before a stall is suspected "
            "(default: a fifth of the job's timeout, 10-120 s)",
        )
        _seconds(
            parser,
            "--busy-stall",
            "the same while ranks burn CPU (NCCL spins; default 3x --stall, at most half the job's timeout)",
        )
        _seconds(parser, "--confirm", "seconds before the confirming second sample (default: --interval)")
        _seconds(parser, "--resume", "seconds of renewed progress that mark an incident resumed (default 10)")
        _seconds(
            parser,
            "--job-timeout",
            "the job's collective timeout when it is not read from its args, "
            "env or its script's init_process_group (default: torch's for its backend)",
        )
        _seconds(
            parser, "--linger", "seconds to wait for a new attempt once every process is gone (default 0)"
        )
        parser.add_argument(
            "--max-incidents", type=int, default=20, metavar="N", help="incidents kept (default 20)"
        )
        parser.add_argument(
            "--max-incident-bytes",
            type=int,
            default=32 * 1024 * 1024,
            metavar="B",
            help="bytes one incident may hold (default 32 MiB)",
        )
        parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, help=argparse.SUPPRESS)
        parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help=argparse.SUPPRESS)
        parser.add_argument("--native", action="store_true", help="capture C/C++ frames too (slower)")
        add_json_flag(parser, brief=False)

    def run(self, args: argparse.Namespace) -> int:
        if args.sampler:
            return _sample(args)
        if not args.out:
            raise InvalidInput("rankscope watch needs --out DIR.", fix="Pass --out DIR: the watch's folder.")
        config = api.WatchConfig(
            out=Path(args.out),
            selection=_selection(args),
            interval_s=2.0 if args.interval is None else args.interval,
            stall_s=args.stall,
            busy_stall_s=args.busy_stall,
            confirm_s=args.confirm,
            resume_s=10.0 if args.resume is None else args.resume,
            job_timeout_s=args.job_timeout,
            linger_s=0.0 if args.linger is None else args.linger,
            max_incidents=args.max_incidents,
            max_incident_bytes=args.max_incident_bytes,
            options=api.DumpOptions(window=args.window, timeout=args.timeout, native=args.native),
        )
        if args.detach:
            emit(api.start_watch(config), bool(args.json), full=bool(args.full))
            return 0
        manifest = api.run_watch(config)
        emit(api.read_watch(str(config.out.expanduser().resolve())), bool(args.json), full=bool(args.full))
        return 0 if manifest.state != "failed" else 2


def _selection(args: argparse.Namespace) -> WatchSelection:
    """The job as chosen: here (folder, pid, job id), or on other hosts (--hosts, --via srun --job)."""
    folder = str(Path.cwd())
    if args.hosts is None and args.via is None:
        return WatchSelection(folder=folder, pid=args.pid, job_id=args.job)
    if args.pid is not None:
        raise InvalidInput(
            "--pid picks a job on this host; a watch over --hosts picks it on each host.",
            fix="Pass --job JOB_ID (rankscope stacks --hosts ... names it), or run the watch in the job's folder.",
        )
    via = args.via or "ssh"
    if via == "srun" and not args.job:
        raise InvalidInput("--via srun needs the Slurm job.", fix="Pass --job SLURM_JOB_ID (`squeue --me`).")
    if via == "ssh" and not args.hosts:
        raise InvalidInput("--via ssh needs the hosts.", fix="Pass --hosts node1,node2 (or node[01-04]).")
    hosts = list(api.StacksTarget(hosts=(args.hosts,)).hosts or ()) if args.hosts else []
    return WatchSelection(
        folder=folder,
        job_id=None if via == "srun" else args.job,
        hosts=hosts,
        via=via,
        slurm_job=args.job if via == "srun" else None,
    )


def _sample(args: argparse.Namespace) -> int:
    """One host's sampler for a watch on another host: a JSON line per interval, until the job's
    ranks here end or the watch goes away (its pipe closes)."""
    interval = 2.0 if args.interval is None else args.interval
    try:
        for sample in api.host_samples(args.pid, args.job, args.here, interval, args.job_timeout):
            sys.stdout.write(sample.model_dump_json(exclude_defaults=True) + "\n")
            sys.stdout.flush()
    except BrokenPipeError:
        return 0
    return 0


def _seconds(parser: argparse.ArgumentParser, flag: str, text: str) -> None:
    parser.add_argument(flag, type=float, default=None, metavar="S", help=text)


COMMANDS = [WatchCommand]
