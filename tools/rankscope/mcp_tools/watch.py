"""MCP tools ``start_watch``, ``list_watches``, ``read_watch``: the same answers as `rankscope watch`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import MCPServer

from rankscope import api
from rankscope.mcp_tools._common import READ_ONLY, STARTS_PROCESSES, Full, add_tool, arg, guard, in_thread
from rankscope.models.watch import WatchList, WatchSelection, WatchStarted, WatchView


@guard
async def start_watch(
    out: Annotated[
        str, arg("The watch folder to write (made 0700; absolute, or relative to the server's cwd).")
    ],
    pid: Annotated[
        int | None, arg("A launcher or rank of the job; default: the job started in folder.")
    ] = None,
    job_id: Annotated[str | None, arg("The job id when several run here (list_jobs names them).")] = None,
    folder: Annotated[
        str | None, arg("The folder the job was started in (default: the server's cwd).")
    ] = None,
    stall_s: Annotated[float | None, arg("Seconds of no progress, ranks idle, that suspect a stall.")] = None,
    interval_s: Annotated[float, arg("Seconds between two /proc samples.")] = 2.0,
    job_timeout_s: Annotated[
        float | None, arg("The job's collective timeout, when its args/env do not say.")
    ] = None,
    full: Full = False,
) -> WatchStarted:
    """Start a watch beside a job that is already running on this host, detached: it outlives this call.

    Use it when the user suspects a hang will come back (overnight, after a restart, killed by the
    watchdog). Between incidents it reads /proc only (nothing pauses the job); on a stall it
    captures every rank's stacks, the recorder, env, GPU state and log tails into out/incidents/
    well before the job's own timeout, then goes on; a torchrun restart is a new attempt. It stops
    when the job ends. Read it later with read_watch, or triage_logs on the folder.
    """
    config = api.WatchConfig(
        out=Path(out),
        selection=WatchSelection(folder=folder or str(Path.cwd()), pid=pid, job_id=job_id),
        stall_s=stall_s,
        interval_s=interval_s,
        job_timeout_s=job_timeout_s,
    )
    started = await in_thread(api.start_watch, config)
    return api.answer(started, full=full)


@guard
async def list_watches(
    dirs: Annotated[
        list[str] | None, arg("Watch folders to read; default: every watch started on this host.")
    ] = None,
    full: Full = False,
) -> WatchList:
    """The watches on this host: folder, state (watching, job_ended, stopped, failed), watcher alive, incidents."""
    found = await in_thread(api.list_watches, dirs)
    return api.answer(found, full=full)


@guard
async def read_watch(
    dir: Annotated[str, arg("A watch folder (the out of start_watch).")],
    full: Full = False,
) -> WatchView:
    """One watch folder read back: the watch (job, attempts, thresholds, the job's timeout and its
    source) and each incident's manifest (stalled or resumed, complete or not, the pieces captured,
    how long before the job ended). For the verdict on a stall, triage the folder."""
    view = await in_thread(api.read_watch, dir)
    return api.answer(view, full=full)


def register(server: MCPServer) -> None:
    add_tool(server, start_watch, title="Watch a running job for a stall", annotations=STARTS_PROCESSES)
    add_tool(server, list_watches, title="List the watches on this host", annotations=READ_ONLY)
    add_tool(server, read_watch, title="Read a watch folder", annotations=READ_ONLY)
