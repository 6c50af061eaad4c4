"""``rankscope stacks``: every rank's stack at once, grouped, with a verdict.

Exit codes: 0 whenever a report was produced, whatever the verdict (a hang is a
finding, not a failure of rankscope; scripts read ``verdict.kind`` from ``--json``);
2 for errors (no such pid, not a distributed job, py-spy missing, permission
denied). A rank that exits during capture is a per-rank error inside the report.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from rankscope import api
from rankscope.commands.base import Command, add_json_flag, emit
from rankscope.errors import InvalidInput, RankscopeError
from rankscope.models.core import StacksReport


def _render(model: BaseModel) -> Iterator[str]:
    from rankscope.analysis.render_stacks import render_stacks  # only when printing for a person

    assert isinstance(model, StacksReport)
    return render_stacks(model)


REMOTE_VIAS: tuple[str, ...] = ("srun", "kubectl", "debug-server")
"""``--via`` values that find the job's hosts themselves (Slurm allocation, the job's pods,
MASTER_ADDR:MASTER_PORT), so they collect from several hosts even without ``--hosts``."""


def _hosts(value: str | None) -> list[str] | None:
    """``--hosts`` split at top-level commas; Slurm hostlists (``node[01-04,07]``) are expanded."""
    if value is None:
        return None
    from rankscope.remote import expand_hostlist  # only for several hosts: keeps `stacks` start-up lean

    hosts: list[str] = []
    for part in _split_top(value):
        part = part.strip()
        if not part:
            continue
        if "[" in part and not part.startswith(("ssh://", "[")):
            hosts.extend(expand_hostlist(part))
        else:
            hosts.append(part)  # a plain name, ssh://user@host:port or an IPv6 literal
    if not hosts:
        raise InvalidInput(
            "--hosts is empty.",
            fix="Pass a comma-separated host list, e.g. --hosts node1,node2 or node[01-04].",
        )
    return list(dict.fromkeys(hosts))


def _split_top(value: str) -> list[str]:
    """Split at commas outside brackets: in ``node[01-04,07],gpu1`` the first comma is part of a hostlist."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(value):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(value[start:i])
            start = i + 1
    parts.append(value[start:])
    return parts


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
        parser.add_argument("--timeout", type=float, default=20.0, help="seconds per rank (default 20)")
        parser.add_argument(
            "--rank",
            type=int,
            action="append",
            dest="ranks",
            metavar="N",
            help="only these ranks (repeatable)",
        )
        remote = parser.add_argument_group("several hosts")
        remote.add_argument(
            "--hosts",
            help="comma-separated hosts to collect from (runs `rankscope stacks --local --json` there)",
        )
        remote.add_argument(
            "--via",
            choices=("ssh", *REMOTE_VIAS),
            default="ssh",
            help="how to reach the hosts: ssh (needs --hosts); srun, kubectl and debug-server find the "
            "job's hosts themselves (SLURM_JOB_NODELIST, the pods of --job, MASTER_ADDR:MASTER_PORT) "
            "when --hosts is left out; debug-server takes --hosts MASTER_ADDR:PORT",
        )
        remote.add_argument("--job", help="SLURM job id (--via srun) or pod selector (--via kubectl)")
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
        add_json_flag(parser)

    def run(self, args: argparse.Namespace) -> int:
        pid: int | None = args.pid
        timeout: float = args.timeout
        if timeout <= 0:
            raise InvalidInput(f"--timeout must be positive, got {timeout:g}.", fix="Pass e.g. --timeout 20.")
        if pid is not None and pid <= 0:
            raise InvalidInput(
                f"--pid must be a positive process id, got {pid}.", fix="Run `rankscope ps` to find one."
            )
        hosts = _hosts(args.hosts)
        via: str = args.via
        as_json: bool = args.json or args.local
        if not args.local and (hosts or via in REMOTE_VIAS):
            report = _remote(
                hosts=hosts,
                via=via,
                job=args.job,
                namespace=args.namespace,
                pid=pid,
                native=args.native,
                locals=args.locals,
                nonblocking=args.nonblocking,
                timeout=timeout,
                rankscope_cmd=args.rankscope_cmd,
            )
        else:
            report = api.dump_stacks(
                pid,
                native=args.native,
                locals=args.locals,
                nonblocking=args.nonblocking,
                timeout=timeout,
                ranks=args.ranks,
            )
        emit(report, as_json, _render)
        return 0


def _remote(**kwargs: Any) -> StacksReport:
    """``api.dump_stacks_remote`` with the command's plain arguments, or a clear error without it."""
    try:
        importlib.import_module("rankscope.remote")
        fn = api.dump_stacks_remote
    except (ModuleNotFoundError, AttributeError) as exc:
        raise RankscopeError(
            "Collecting stacks from several hosts (--hosts, --via) is not available in this installation.",
            fix="Run `rankscope stacks --local --json` on each host and compare, or upgrade rankscope.",
        ) from exc
    report: StacksReport = fn(**kwargs)
    return report


COMMANDS = [StacksCommand]
