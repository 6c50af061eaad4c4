"""MCP tools ``list_jobs`` and ``dump_stacks``: the first two steps for a hang.

Thin adapters over ``rankscope.api``: they check arguments the way an agent
gets them wrong, run the blocking capture in a worker thread, report progress,
and bound the answer so a 64-rank job does not flood the agent's context.
"""

from __future__ import annotations

from typing import Any, Literal

from mcp.server.mcpserver import Context, MCPServer

from rankscope import api
from rankscope.mcp_tools._common import READ_ONLY, add_tool, guard, in_thread, progress
from rankscope.models.core import JobList, StacksReport

Via = Literal["ssh", "srun", "kubectl", "debug-server"]
"""How dump_stacks reaches ranks on other nodes (see rankscope.remote)."""

MAX_ANSWER_BYTES = 16_000
"""Upper bound of a default dump_stacks answer, in bytes of JSON."""


@guard
async def list_jobs(pid: int | None = None, ctx: Context[Any, Any] | None = None) -> JobList:
    """List the distributed PyTorch jobs running on this host: launcher, world size, and every rank's pid, state and rank number.

    Call it first in an incident to find the job. With pid (a rank or its
    launcher: torchrun, mp.spawn parent, srun, mpirun) it describes only that
    job. Ranks in missing_ranks run on other hosts or have exited. Next: for a
    hang, dump_stacks with the launcher pid.
    """
    api.check_pid(pid)
    await progress(ctx, 0, 1, "scanning /proc for distributed jobs")
    report = await in_thread(api.list_jobs, pid)
    await progress(ctx, 1, 1, f"found {len(report.jobs)} job(s)")
    return report


@guard
async def dump_stacks(
    pid: int | None = None,
    native: bool = False,
    locals: bool = False,
    nonblocking: bool = False,
    full_ranks: list[int] | None = None,
    ranks: list[int] | None = None,
    hosts: list[str] | None = None,
    via: Via = "ssh",
    job: str | None = None,
    namespace: str | None = None,
    timeout: float = 20.0,
    counters: bool = True,
    flight_recorder: bool = True,
    from_paths: list[str] | None = None,
    backend: Literal["auto", "nccl", "gloo"] = "auto",
    job_id: str | None = None,
    ctx: Context[Any, Any] | None = None,
) -> StacksReport:
    """Capture the Python (and optionally native) stack of every rank of a job and say which ranks are stuck where.

    Read verdict.kind first: mismatched_collectives (ranks wait in different
    collectives), divergent_ranks (some ranks left the common path),
    missing_ranks (a rank exited or was not found), all_in_same_collective
    (everyone waits in the same call: look at the network, a peer on another
    host, or a slow rank), no_collective (not a communication hang), or
    inconclusive. verdict.suspect_ranks names the culprits and next_steps says
    what to do. The answer is bounded to about 16 KB: groups of ranks with one
    representative stack each; pass full_ranks=[...] to get the full stacks of
    those ranks. ranks: capture only these ranks (this host; the verdict then
    covers them alone), e.g. the suspects of a previous answer with
    native=True. pid: a rank or launcher pid from list_jobs (default: the only
    job on this host). native: include C/C++ frames (NCCL, gloo). locals:
    include local variables (redacted; slower). Ranks blocked in a send/recv
    are read a second time for their peer (stacks[].peer), so a send/recv
    deadlock is named as a cycle of waits; their locals are not returned unless
    locals=True. nonblocking: do not pause the
    ranks while sampling (less consistent stacks, for latency-sensitive jobs).
    hosts: capture the ranks of every node at once, one verdict for the whole
    job: via 'ssh' (hosts required), 'srun' (inside the Slurm allocation; job:
    the Slurm job id; hosts default to its nodes), 'kubectl' (job: the
    Kubernetes job whose pods to use, namespace: its namespace) or
    'debug-server' (PyTorch's debug server on every rank, found through the
    job's TCPStore: hosts=['MASTER_ADDR:PORT'], default MASTER_ADDR:MASTER_PORT
    of this environment; no ssh needed). timeout: seconds per rank.
    On NCCL read stacks[].wait: 'gpu' means the CPU waits for the GPU, queued
    behind the stuck collective, not stuck where it stands. counters: when the
    first verdict is not sure, read progress counters (step, epoch) in one more
    pass (integers only). flight_recorder: analyse the recorder dumps this run
    already wrote, with the stacks. Trust verdict.confidence.
    from_paths: analyse saved stacks instead (the job is gone): py-spy dumps
    (text or JSON, one file per rank), faulthandler output, or a torchrun log
    with [rankN]: prefixes; backend: 'nccl' or 'gloo' when the files do not
    show it. Unreadable files are listed in errors; the rest is analysed.
    job_id: which job of this host (list_jobs gives the ids) when several run here.
    """
    remote = hosts is not None or via != "ssh" or job is not None or namespace is not None
    api.check_stacks_call(
        pid=pid, ranks=ranks, hosts=hosts, remote=remote, full_ranks=full_ranks, from_paths=from_paths
    )
    options = api.DumpOptions(
        native=native,
        locals=locals,
        nonblocking=nonblocking,
        timeout=timeout,
        counters=counters,
        flight_recorder=flight_recorder,
    )
    if from_paths is not None:
        await progress(ctx, 0, 2, f"reading saved stacks from {len(from_paths)} path(s)")
        report = await in_thread(
            api.stacks_from_files, from_paths, backend=None if backend == "auto" else backend
        )
    elif remote:
        where = (f"{len(hosts)} host(s)" if hosts else "the job's hosts") + f" via {via}"
        await progress(ctx, 0, 3, f"finding the job's ranks on {where}")
        await progress(ctx, 1, 3, f"capturing stacks on {where}")
        report = await in_thread(
            _remote, options, hosts=hosts, via=via, job=job, namespace=namespace, pid=pid
        )
    else:
        await progress(ctx, 0, 3, "finding the job's ranks on this host")
        await progress(ctx, 1, 3, "capturing stacks with py-spy on this host")
        report = await in_thread(_local, options, pid=pid, ranks=ranks, job_id=job_id)
    await progress(ctx, 2, 3, f"analysed {len(report.stacks)} rank(s)")
    from rankscope.analysis.bound import bound_report

    bounded = bound_report(report, max_bytes=MAX_ANSWER_BYTES, full_ranks=full_ranks)
    await progress(ctx, 3, 3, f"verdict: {bounded.verdict.kind}")
    return bounded


def _local(
    options: api.DumpOptions, *, pid: int | None, ranks: list[int] | None, job_id: str | None
) -> StacksReport:
    return api.dump_stacks(
        pid,
        native=options.native,
        locals=options.locals,
        nonblocking=options.nonblocking,
        timeout=options.timeout,
        ranks=ranks,
        counters=options.counters,
        flight_recorder=options.flight_recorder,
        job_id=job_id,
    )


def _remote(options: api.DumpOptions, **where: Any) -> StacksReport:
    report: StacksReport = api.dump_stacks_remote(
        **where,
        native=options.native,
        locals=options.locals,
        nonblocking=options.nonblocking,
        timeout=options.timeout,
    )
    return report


def register(server: MCPServer) -> None:
    add_tool(server, list_jobs, title="List distributed PyTorch jobs on this host", annotations=READ_ONLY)
    add_tool(
        server, dump_stacks, title="Stacks of every rank, grouped, with a verdict", annotations=READ_ONLY
    )
