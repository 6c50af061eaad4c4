"""One live stacks call, the CLI's and the MCP server's alike.

Where the ranks are decides once whether this host captures them (``stacks.dump_stacks``) or
every host of the target does (``remote.dump_stacks_remote``, a ``HOST:PID``'s job picked on
every host); either answer is kept for the next call (``--last``, ``last=true``, a repro from it),
marked partial when only some ranks were captured.
"""

from __future__ import annotations

from rankscope.capabilities.last_capture import save_capture, with_whole_suspects
from rankscope.capabilities.remote import dump_stacks_remote
from rankscope.capabilities.stacks import dump_stacks
from rankscope.models.core import StacksReport
from rankscope.options import DumpOptions, StacksTarget


def live_stacks(
    target: StacksTarget,
    options: DumpOptions,
    *,
    pid: int | None = None,
    pid_host: str | None = None,
    ranks: list[int] | None = None,
    job_id: str | None = None,
) -> StacksReport:
    """The verdict on a live job, here or on the target's hosts, kept for the next call. ``pid`` on
    ``pid_host`` (a launcher or rank on another host) picks the job there and, by its id, on the
    other hosts; ``ranks`` (this host only) captures fewer ranks and keeps the last full capture's
    suspects in view."""
    if target.remote:
        pids = {pid_host: pid} if pid_host is not None and pid is not None else None
        report = dump_stacks_remote(target, options, pid=None if pids else pid, pids=pids, job_id=job_id)
    else:
        report = dump_stacks(pid, options, ranks=ranks, job_id=job_id)
    if ranks is not None:
        report = with_whole_suspects(report, ranks)
    save_capture(report, partial=ranks is not None)
    return report


__all__ = ["live_stacks"]
