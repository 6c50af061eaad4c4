"""Flight-recorder dumps a live job already wrote, found from its ranks' environments.

On NCCL the collective state outranks where each CPU stopped (skill/hangs.md#nccl-hangs).
torch 2.13 writes each rank's recorder on a watchdog timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``,
on by default) to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (alias ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``),
by default ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_<rank>`` or
``$HOME/.cache/torch/comm_lib_trace_rank_<rank>`` (``DebugInfoWriter::getWriter``). Only
files written since the rank started belong to this run. Reading them is harmless; this
module never asks the job for a dump (writing the TCPStore's ``exception_dump`` key kills it).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rankscope import procfs
from rankscope.analysis.flight import analyze as analyze_flight
from rankscope.flight import read_dumps
from rankscope.models.core import Job, RankProcess
from rankscope.models.flight import FlightReport

log = logging.getLogger("rankscope.flight_pickup")

DEFAULT_NAME = "comm_lib_trace_rank_"
START_SLACK_S = 2.0


def dump_path(rank: int, env: dict[str, str]) -> Path:
    """Where this rank's recorder dump goes, by the rules of torch 2.13's DebugInfoWriter."""
    prefix = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if prefix:
        return Path(f"{prefix}{rank}")
    cache = env.get("XDG_CACHE_HOME")
    base = Path(cache) if cache else Path(env.get("HOME") or "/tmp") / ".cache"
    return base / "torch" / f"{DEFAULT_NAME}{rank}"


def _fresh(proc: RankProcess, env: dict[str, str]) -> Path | None:
    if proc.rank is None:
        return None
    path = dump_path(proc.rank, env)
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    started = procfs.start_epoch(proc.pid)
    # btime has whole seconds: allow that much before calling a dump older than the rank
    if started is not None and mtime < started - START_SLACK_S:
        log.info("ignoring %s: written before rank %d started", path, proc.rank)
        return None
    return path


def find_dumps(job: Job) -> list[Path]:
    """This run's recorder dumps on this host, one per rank at most."""
    found: list[Path] = []
    for proc in job.ranks:
        env = procfs.read_environ(proc.pid) or {}
        path = _fresh(proc, env)
        if path is not None:
            found.append(path)
    return found


def pick_up(job: Job) -> FlightReport | None:
    """The analysis of the dumps the job's ranks already wrote, or None when there are none."""
    paths = find_dumps(job)
    if not paths:
        return None
    dumps, errors = read_dumps([os.fspath(p) for p in paths])
    if not dumps:
        return None
    return analyze_flight(dumps, errors, world_size=job.world_size)


__all__ = ["dump_path", "find_dumps", "pick_up"]
