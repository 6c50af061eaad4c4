"""MCP tools ``list_jobs`` and ``dump_stacks``: the first two steps for a hang.

Thin adapters over ``rankscope.api``: they check arguments the way an agent
gets them wrong, run the blocking capture in a worker thread, report progress,
and bound the answer so a 64-rank job does not flood the agent's context.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from mcp.server.mcpserver import Context, MCPServer

from rankscope import api
from rankscope.mcp_tools._common import (
    LAST_ANSWERS,
    READ_ONLY,
    Full,
    add_tool,
    arg,
    guard,
    in_thread,
    progress,
)
from rankscope.models.core import JobList, StacksReport
from rankscope.options import DEFAULT_TIMEOUT_S, DEFAULT_WINDOW_S, DumpOptions, StacksTarget, host_pid

Via = Literal["ssh", "srun", "kubectl", "debug-server"]
"""How dump_stacks reaches ranks on other nodes (see rankscope.capabilities.remote)."""


@guard
async def list_jobs(
    pid: Annotated[int | None, arg("A rank or launcher pid: describe only its job.")] = None,
    details: Annotated[
        bool, arg("List every rank process of each job (default: one rank and a count).")
    ] = False,
    full: Full = False,
    ctx: Context[Any, Any] | None = None,
) -> JobList:
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
    return api.answer(report, full=full or details)


@guard
async def dump_stacks(
    pid: Annotated[
        int | str | None, arg("A pid from list_jobs (rank or launcher), or HOST:PID on another host.")
    ] = None,
    native: Annotated[
        bool, arg("Include C/C++ frames (NCCL, gloo, CUDA): decides GPU waits. Slower.")
    ] = False,
    locals: Annotated[bool, arg("Include local variables (redacted). Slower.")] = False,
    nonblocking: Annotated[
        bool, arg("Do not pause the ranks while sampling (less consistent stacks).")
    ] = False,
    full_ranks: Annotated[list[int] | None, arg("Return the full stacks of these ranks.")] = None,
    last: Annotated[
        bool, arg("Answer again from the last capture (with full_ranks: more of it), not a new one.")
    ] = False,
    ranks: Annotated[
        list[int] | None, arg("Capture only these ranks of this host; the verdict covers them.")
    ] = None,
    hosts: Annotated[
        list[str] | None, arg("Capture every node at once: node names or Slurm hostlists.")
    ] = None,
    via: Annotated[Via, arg("How to reach other hosts: ssh, srun, kubectl or debug-server.")] = "ssh",
    job: Annotated[str | None, arg("Slurm job id (via=srun) or Kubernetes job (via=kubectl).")] = None,
    namespace: Annotated[str | None, arg("Kubernetes namespace (via=kubectl).")] = None,
    timeout: Annotated[float, arg("Seconds per rank.")] = DEFAULT_TIMEOUT_S,
    counters: Annotated[
        bool, arg("Read progress counters (step, epoch): free with a window, one more pass without.")
    ] = True,
    flight_recorder: Annotated[
        bool, arg("Read this run's recorder dumps, asking ranks with a dump channel for one.")
    ] = True,
    ras: Annotated[bool, arg("Read NCCL RAS launch counts (off by default: it has crashed jobs).")] = False,
    window_s: Annotated[
        float, arg("Seconds to watch the job before naming anyone (0: one look); widen for long steps.")
    ] = DEFAULT_WINDOW_S,
    from_paths: Annotated[
        list[str] | None, arg("Saved stacks instead of a live job: py-spy dumps, faulthandler output, logs.")
    ] = None,
    backend: Annotated[
        Literal["auto", "nccl", "gloo"], arg("The backend of saved stacks when the files do not show it.")
    ] = "auto",
    job_id: Annotated[
        str | None, arg("Which job (list_jobs ids) when several run here or on the hosts.")
    ] = None,
    full: Full = False,
    ctx: Context[Any, Any] | None = None,
) -> StacksReport:
    """Capture the stack of every rank of a job (or read saved ones) and name the rank and line at fault.

    It watches the job for window_s first: a moving job gets progressing, straggler or busy (look
    again with a longer window_s), never a hang kind (mismatched_collectives, divergent_ranks,
    missing_ranks, all_in_same_collective, no_collective, inconclusive). Read verdict.kind, suspects,
    confidence, summary, next_steps. On NCCL, wait 'gpu' = queued behind the stuck collective.
    """
    options = DumpOptions(
        native=native,
        locals=locals,
        nonblocking=nonblocking,
        counters=counters,
        flight_recorder=flight_recorder,
        ras=ras,
        window=window_s,
        timeout=timeout,
    )
    pid_host, pid_number = host_pid(pid) if pid is not None else (None, None)
    target = StacksTarget(hosts=_with_host(hosts, pid_host), via=via, job=job, namespace=namespace)
    api.check_stacks_call(
        pid=pid_number, ranks=ranks, target=target, full_ranks=full_ranks, from_paths=from_paths, last=last
    )
    if last:
        return api.answer(await _last(), full=full, full_ranks=full_ranks)
    if from_paths is not None:
        await progress(ctx, 0, 2, f"reading saved stacks from {len(from_paths)} path(s)")
        report = await in_thread(api.stacks_from_files, from_paths, backend=_backend(backend))
    else:
        report = await _capture(ctx, options, target, pid=(pid_host, pid_number), ranks=ranks, job_id=job_id)
    return await _answer(ctx, report, full=full, full_ranks=full_ranks, saved=from_paths is not None)


def _backend(backend: str) -> Literal["nccl", "gloo"] | None:
    return None if backend == "auto" else cast(Literal["nccl", "gloo"], backend)


async def _last() -> StacksReport:
    """The capture this server answered last, else the last one kept on this host (the CLI's)."""
    kept = LAST_ANSWERS.stacks
    return kept if isinstance(kept, StacksReport) else await in_thread(api.last_capture)


async def _answer(
    ctx: Context[Any, Any] | None,
    report: StacksReport,
    *,
    full: bool,
    full_ranks: list[int] | None,
    saved: bool,
) -> StacksReport:
    """Keep the whole report for the next call (a repro from it, ``last=true``), here and, for saved
    stacks, for the CLI's ``--last`` (a live capture was kept by ``api.live_stacks``). Return it
    bounded unless ``full``."""
    await progress(ctx, 2, 3, f"analysed {len(report.stacks)} rank(s)")
    if saved:  # a live capture was kept by the call itself (api.live_stacks)
        await in_thread(api.save_capture, report, partial=True)
    LAST_ANSWERS.stacks = report
    await progress(ctx, 3, 3, f"{api.verdict_label(report)}: {report.verdict.kind}")
    return api.answer(report, full=full, full_ranks=full_ranks)


def _with_host(hosts: list[str] | None, host: str | None) -> tuple[str, ...] | None:
    """The hosts to ask, with the host of a ``HOST:PID`` among them: its job, on every host."""
    if host is None or host in (hosts or []):
        return None if hosts is None else tuple(hosts)
    return (*(hosts or []), host)


async def _capture(
    ctx: Context[Any, Any] | None,
    options: DumpOptions,
    target: StacksTarget,
    *,
    pid: tuple[str | None, int | None],
    ranks: list[int] | None,
    job_id: str | None,
) -> StacksReport:
    """A live capture, on this host or (a remote ``target``) on the job's hosts, with its progress steps;
    on a Slurm cluster a plain call may mean a Slurm job's nodes (``api.slurm_target``)."""
    host, number = pid  # HOST:PID: a launcher or rank on another host
    target = await in_thread(api.slurm_target, target, pid=number, job_id=job_id, ranks=ranks)
    place = (
        (f"{len(target.hosts)} host(s)" if target.hosts else "the job's hosts") + f" via {target.via}"
        if target.remote
        else "this host"
    )
    await progress(ctx, 0, 3, f"finding the job's ranks on {place}")
    await progress(ctx, 1, 3, f"capturing stacks on {place}")
    return await in_thread(
        api.live_stacks, target, options, pid=number, pid_host=host, ranks=ranks, job_id=job_id
    )


def register(server: MCPServer) -> None:
    add_tool(server, list_jobs, title="List distributed PyTorch jobs on this host", annotations=READ_ONLY)
    add_tool(
        server, dump_stacks, title="Stacks of every rank, grouped, with a verdict", annotations=READ_ONLY
    )
