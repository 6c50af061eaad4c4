"""Flight-recorder dumps a live job already wrote, found from its ranks' environments.

On NCCL the collective state outranks where each CPU stopped (skill/hangs.md#nccl-hangs).
torch 2.13 writes each rank's recorder on a watchdog timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``,
on by default) to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (alias ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``),
by default ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_<rank>`` or
``$HOME/.cache/torch/comm_lib_trace_rank_<rank>`` (``DebugInfoWriter::getWriter``). Only
files written since the rank started belong to this run. Reading them is harmless; this
module asks a live rank for a dump only through the channel the job opened for it: the
named pipe of ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` (``<stem><rank>.pipe``, created by each
rank's NCCL heartbeat monitor; a byte written there makes it dump and training goes on),
and the signal of ``rankscope.probe.enable_flight_recorder`` (the rank holds its marker file
open, and its handler, checked in ``SigCgt``, dumps from a thread while training goes on; this
works on gloo as well), and the worker server of ``TORCH_WORKER_SERVER_SOCKET`` (torchelastic's
``worker_main``), asked for its ``fr_trace_json``; when the stacks leave the verdict unsure, the
worker servers of ``torch.distributed.debug.start_debug_server`` too. On NCCL jobs it reads the TCPStore's ``exception_dump`` key (the rank
whose watchdog first saw a failure) and never writes it: that dumps, then kills the job.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankscope.analysis.env_checks import blocking_wait_on, dump_on_timeout_off, recorder_off
from rankscope.analysis.recorder.flight import LoadedDump
from rankscope.analysis.recorder.flight import analyze as analyze_flight
from rankscope.capabilities.recorder.debug_server import debug_server_trace, debug_server_urls
from rankscope.capabilities.recorder.flight import read_dumps
from rankscope.errors import RankscopeError
from rankscope.models.core import Job, RankError, RankProcess
from rankscope.models.flight import FlightReport
from rankscope.probe.flight import BUSY_PREFIX, MARKER_PREFIX, TRACE_PREFIX
from rankscope.runtime import net, procfs, signals, tcpstore

log = logging.getLogger("rankscope.capabilities.recorder.pickup")

DEFAULT_NAME = "comm_lib_trace_rank_"
START_SLACK_S = 5.0


def dump_path(rank: int, env: dict[str, str]) -> Path:
    """Where this rank's recorder dump goes, by the rules of torch 2.13's DebugInfoWriter."""
    prefix = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if prefix:
        return Path(f"{prefix}{rank}")
    cache = env.get("XDG_CACHE_HOME")
    base = Path(cache) if cache else Path(env.get("HOME") or "/tmp") / ".cache"
    return base / "torch" / f"{DEFAULT_NAME}{rank}"


@dataclass(frozen=True)
class Probe:
    """A rank that runs rankscope.probe's flight recorder: where it dumps and what asks it to."""

    dump_dir: Path
    signal: int

    def trace(self, rank: int) -> Path:
        return self.dump_dir / f"{TRACE_PREFIX}{rank}"

    def busy(self, rank: int) -> Path:
        """There while the rank writes its dump: the sign that it took a request."""
        return self.dump_dir / f"{BUSY_PREFIX}{rank}"


def probe_of(pid: int) -> Probe | None:
    """The probe's marker among the process's open files, read through /proc; None without one."""
    for link, target in procfs.open_files(pid, MARKER_PREFIX):
        try:
            with open(link, "rb") as fh:
                info = json.loads(fh.read(4096))
            return Probe(dump_dir=Path(target).parent, signal=int(info["signal"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.info("pid %d: unreadable probe marker %s: %s", pid, target, exc)
    return None


def find_probes(job: Job) -> dict[int, Probe]:
    """pid -> the probe of each rank that runs one; read once per capture and handed around."""
    return {p.pid: probe for p in job.ranks if (probe := probe_of(p.pid)) is not None}


def _targets(proc: RankProcess, env: dict[str, str], probe: Probe | None) -> list[Path]:
    """Where this rank's dumps may be: the probe's folder, then torch's own path."""
    if proc.rank is None:
        return []
    paths = [probe.trace(proc.rank)] if probe is not None else []
    return [*paths, dump_path(proc.rank, env)]


def _fresh(proc: RankProcess, env: dict[str, str], probe: Probe | None) -> Path | None:
    for path in _targets(proc, env, probe):
        if _fresh_one(proc, path):
            return path
    return None


def _fresh_one(proc: RankProcess, path: Path) -> bool:
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return False
    started = procfs.start_epoch(proc.pid)
    # clock granularity and steps: a dump older than the rank by more than this is a previous run's
    if started is not None and mtime < started - START_SLACK_S:
        log.info("ignoring %s: written before rank %d started", path, proc.rank)
        return False
    return True


def _environs(job: Job) -> dict[int, dict[str, str]]:
    """Each rank's environment, read once for both the pickup and the request (pid -> env)."""
    return {proc.pid: procfs.read_environ(proc.pid) or {} for proc in job.ranks}


def find_dumps(
    job: Job,
    environs: Mapping[int, dict[str, str]] | None = None,
    probes: Mapping[int, Probe] | None = None,
) -> list[Path]:
    """This run's recorder dumps on this host, one per rank at most."""
    envs = environs if environs is not None else _environs(job)
    probed = probes if probes is not None else find_probes(job)
    found: list[Path] = []
    for proc in job.ranks:
        path = _fresh(proc, envs.get(proc.pid, {}), probed.get(proc.pid))
        if path is not None:
            found.append(path)
    return found


PIPE_WAIT_S = 5.0
"""How long to wait for the dumps asked for through the pipes (the monitor polls every second),
and for a probed rank to start writing its dump."""
DUMP_WAIT_S = 30.0
"""How long a probed rank that is writing its dump (its busy file is there) may take: torch 2.13's
first recorder dump in a process imports torch._inductor, seconds alone and longer when every
rank of a busy host does it at once."""


def _ask(pipe: Path) -> bool:
    """Write one byte into a rank's debug pipe; False when it is not a pipe or nobody reads it."""
    try:
        if not stat.S_ISFIFO(pipe.stat().st_mode):
            return False
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO when no reader: never blocks
    except OSError:
        return False
    try:
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime, st.st_size


def _ask_probe(pid: int, probe: Probe) -> bool:
    """Signal a probed rank, only when its probe's handler for that signal is installed."""
    why_not = signals.send_if_handled(pid, probe.signal)
    if why_not is not None:
        log.info("pid %d: probe marker found but %s; not signalled", pid, why_not)
        return False
    return True


@dataclass(frozen=True)
class _Request:
    """One rank asked for a dump: where it will land and that file's stamp before asking; for a
    probed rank, the file that is there while it writes (and its stamp before asking: a leftover
    of a killed run is not this request's)."""

    target: Path
    before: tuple[float, int] | None
    busy: Path | None = None
    busy_before: tuple[float, int] | None = None

    def writing(self) -> bool:
        return self.busy is not None and _stamp(self.busy) not in (None, self.busy_before)


def _request_planned(
    proc: RankProcess, env: dict[str, str], have: list[Path], probe: Probe | None
) -> tuple[_Request, Callable[[], bool]] | None:
    """How to ask one rank for a dump through the channel it opened: the request (stamped before
    asking) and the call that asks. None without a channel."""
    if proc.rank is None:
        return None
    if probe is not None:
        target, busy = probe.trace(proc.rank), probe.busy(proc.rank)
        if target in have:
            return None
        return _Request(target, _stamp(target), busy, _stamp(busy)), lambda: _ask_probe(proc.pid, probe)
    stem = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    target = dump_path(proc.rank, env)
    if not stem or target in have:
        return None
    pipe = Path(f"{stem}{proc.rank}.pipe")
    return _Request(target, _stamp(target)), lambda: _ask(pipe)


def request_dumps(
    job: Job,
    have: list[Path],
    wait_s: float = PIPE_WAIT_S,
    environs: Mapping[int, dict[str, str]] | None = None,
    probes: Mapping[int, Probe] | None = None,
    dump_wait_s: float = DUMP_WAIT_S,
) -> list[Path]:
    """Ask the ranks that opened a channel for it (a debug pipe, the probe's signal) and wrote no
    dump yet for one; the dumps they wrote.

    A dump counts once it is new (its mtime or size changed since the request), not empty, and
    the same on two polls in a row: the writer has finished. A rank gets ``wait_s``, and
    ``dump_wait_s`` while it is writing one (a probed rank's busy file is there, or a new dump is).
    """
    envs = environs if environs is not None else _environs(job)
    probed = probes if probes is not None else find_probes(job)
    asked: list[_Request] = []
    for proc in job.ranks:
        planned = _request_planned(proc, envs.get(proc.pid, {}), have, probed.get(proc.pid))
        if planned is not None and planned[1]():
            asked.append(planned[0])
    got: list[Path] = []
    seen = {r.target: r.before for r in asked}
    start = time.monotonic()
    while asked:
        time.sleep(0.2)
        for request in list(asked):
            now = _stamp(request.target)
            if now is not None and now != request.before and now[1] > 0 and now == seen[request.target]:
                got.append(request.target)
                asked.remove(request)
            seen[request.target] = now
        waited = time.monotonic() - start
        writing = [r for r in asked if r.writing() or seen[r.target] != r.before]
        for request in [r for r in asked if waited >= (dump_wait_s if r in writing else wait_s)]:
            asked.remove(request)
            log.info(
                "asked for a flight-recorder dump at %s: none came within %.0f s", request.target, waited
            )
    return got


def recorder_plan(
    job: Job, environs: Mapping[int, dict[str, str]], probes: Mapping[int, Probe] | None = None
) -> str | None:
    """For an NCCL job: where and when its ranks write their recorder, and how to get a dump now,
    from their launch environment (settings made in code, e.g. torchtitan's, are not visible)."""
    if job.backend not in ("nccl", "mixed"):
        return None
    env = next((environs[p.pid] for p in job.ranks if p.pid in environs), None)
    if env is None:
        return None
    seen = "read from the ranks' launch environment; settings made in code do not show"
    if recorder_off(env):
        return (
            f"The flight recorder is off in this job (TORCH_FR_BUFFER_SIZE=0; {seen}): no dump will come. For the "
            "next run unset it (torch 2.13 keeps 2000 entries by default)."
        )
    if blocking_wait_on(env):
        return (
            f"TORCH_NCCL_BLOCKING_WAIT=1 ({seen}) removes NCCL's watchdog: no timeout and no dump will come. For "
            "the next run unset it."
        )
    pattern = f"{os.fspath(dump_path(0, env))[:-1]}<rank>"
    if dump_on_timeout_off(env):
        when = "No dump comes on a timeout (TORCH_NCCL_DUMP_ON_TIMEOUT=0); for the next run unset it."
    else:
        when = (
            "Each rank writes its recorder when its watchdog times out (the process group's timeout: NCCL's "
            f"default is 10 min after the stuck collective started) to {pattern}; analyze those files."
        )
    stem = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    if stem:
        now = f" A dump now: write a byte to {stem}<rank>.pipe (dump_stacks does it)."
    elif probes if probes is not None else find_probes(job):
        now = " rankscope.probe's recorder is on: dump_stacks asks it for a dump."
    else:
        now = (
            " No channel for a dump now was opened; for the next run set TORCH_NCCL_DEBUG_INFO_PIPE_FILE or call "
            "rankscope.probe.enable_flight_recorder."
        )
    return f"{when}{now} ({seen})"


EXCEPTION_DUMP = "exception_dump"
"""The key ProcessGroupNCCL's watchdog sets, in the job's root TCPStore, to its global rank (an
int32 in host byte order) when a collective times out or fails: every rank's monitor then
dumps its recorder. Reading it is harmless; writing it dumps, then kills every rank."""
STORE_TIMEOUT_S = 3.0


def read_exception_dump(addr: str, port: int, timeout: float = STORE_TIMEOUT_S) -> int | None:
    """The global rank in the store's ``exception_dump`` key; None when it is not set.

    Read with the store's own protocol (no torch import: seconds and hundreds of MB with a CUDA
    build); a store that speaks an older dialect is read with torch's client instead. Raises
    OSError when the store cannot be reached, ImportError when only torch could read it and
    torch is missing.
    """
    try:
        raw = tcpstore.read_key(addr, port, EXCEPTION_DUMP, timeout)
    except tcpstore.StoreProtocolError as exc:
        log.info("store %s:%s: %s; reading it with torch's client", addr, port, exc)
        raw = tcpstore.read_key_with_torch(addr, port, EXCEPTION_DUMP, timeout)
    if raw is None:
        return None
    return int.from_bytes(raw[:4], sys.byteorder, signed=True) if len(raw) >= 4 else None


def exception_dump_note(job: Job) -> str | None:
    """What the job's store says about the first failure a rank detected, for an NCCL job whose
    store this host can reach; None when there is nothing to say."""
    if job.backend not in ("nccl", "mixed") or not job.master_addr or not job.master_port:
        return None
    try:
        rank = read_exception_dump(job.master_addr, job.master_port)
    except ImportError:
        return None
    except OSError as exc:
        log.info("cannot read %s from %s:%s: %s", EXCEPTION_DUMP, job.master_addr, job.master_port, exc)
        return None
    if rank is None:
        return f"TCPStore {job.master_addr}:{job.master_port}: {EXCEPTION_DUMP} not set (no watchdog timeout yet)"
    return (
        f"TCPStore {job.master_addr}:{job.master_port}: {EXCEPTION_DUMP}={rank}: rank {rank}'s watchdog saw a "
        "collective time out or fail and asked every rank to dump its flight recorder (the rank that saw it is "
        "not necessarily the one at fault)"
    )


WORKER_SOCKET = "TORCH_WORKER_SERVER_SOCKET"
"""torch.distributed.elastic.control_plane.worker_main serves c10d's worker handlers (``fr_trace_json``,
``dump_traceback``...) on this unix socket; they answer from C++ threads while the rank is stuck."""
WORKER_TIMEOUT_S = 10.0
MAX_TRACE = 64 * 1024 * 1024


def worker_trace(path: str, timeout: float = WORKER_TIMEOUT_S) -> dict[str, Any] | None:
    """The recorder trace (JSON) a rank's worker server answers on its unix socket; None on failure."""
    try:
        status, body = net.http_post_unix(path, "/handler/fr_trace_json", timeout, MAX_TRACE)
        if status != 200:
            log.info("worker server %s answered %s", path, status)
            return None
        data = json.loads(body)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        log.info("worker server %s: %s", path, exc)
        return None
    return data if isinstance(data, dict) else None


def _worker_sockets(job: Job, environs: Mapping[int, dict[str, str]]) -> dict[int, str]:
    """rank -> its worker server's socket, for ranks whose socket is their own (not shared)."""
    found: dict[int, str] = {}
    for proc in job.ranks:
        path = environs.get(proc.pid, {}).get(WORKER_SOCKET)
        if proc.rank is None or not path:
            continue
        try:
            if not stat.S_ISSOCK(os.stat(path).st_mode):
                continue
        except OSError:
            continue
        found[proc.rank] = path
    shared = {p for p in found.values() if list(found.values()).count(p) > 1}
    return {r: p for r, p in found.items() if p not in shared}


DEBUG_SERVER_TIMEOUT_S = 10.0


def worker_servers(job: Job) -> bool:
    """Whether some rank of this host listens on ``[::]``, where torch's debug server binds each
    rank's worker server (:func:`~rankscope.runtime.procfs.listens_on_any_ipv6`): a cheap sign read
    with a host's evidence, so that the collecting host asks the job's store for the servers only
    where one may be."""
    return any(procfs.listens_on_any_ipv6(p.pid) for p in job.ranks)


def debug_server_flight(job: Job, listening: bool) -> FlightReport | None:
    """The recorder traces of every rank, from the worker servers ``start_debug_server`` registered
    in the job's TCPStore; None without torch, without a reachable store or without a server.

    Not read by default: it needs torch here (a second or two to import) and a connection to the
    job's store, so the verdict asks only when the stacks leave it unsure, and only when some rank
    listens where worker servers bind (``listening``, :func:`worker_servers` on the ranks' hosts).
    """
    if not job.master_addr or not job.master_port or not listening:
        return None  # no rank listens where a worker server would: no torch import, no store connection
    try:
        urls = debug_server_urls(job.master_addr, job.master_port, STORE_TIMEOUT_S)
    except (RankscopeError, OSError) as exc:
        log.info("no debug server for %s: %s", job.job_id, exc)
        return None
    if not urls:
        return None
    with ThreadPoolExecutor(max_workers=min(32, len(urls))) as pool:
        traces = list(pool.map(lambda u: debug_server_trace(u, DEBUG_SERVER_TIMEOUT_S), urls))
    dumps = [
        LoadedDump(path=f"{url}/handler/fr_trace_json", rank=rank, format="json", data=trace)
        for rank, (url, trace) in enumerate(zip(urls, traces, strict=True))
        if trace is not None
    ]
    return analyze_flight(dumps, world_size=len(urls)) if dumps else None


def has_channel(job: Job, environs: Mapping[int, dict[str, str]], probes: Mapping[int, Probe]) -> bool:
    """Whether some rank opened a channel a recorder dump can be asked through now (a debug pipe,
    rankscope.probe's signal, a worker socket): only then can a second dump say what moved."""
    if probes:
        return True
    if any(env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") for env in environs.values()):
        return True
    return bool(_worker_sockets(job, environs))


def pick_up(
    job: Job,
    *,
    ask: bool = True,
    environs: Mapping[int, dict[str, str]] | None = None,
    probes: Mapping[int, Probe] | None = None,
) -> FlightReport | None:
    """The analysis of the dumps the job's ranks wrote in this run (and, with ``ask``, of the ones
    asked for through the channels the job opened: debug pipes, the probe's signal, worker-server
    sockets), or None when there are none. ``environs`` and ``probes``: what the caller already
    read of the ranks."""
    environs = environs if environs is not None else _environs(job)
    probes = probes if probes is not None else find_probes(job)
    paths = find_dumps(job, environs, probes)
    if ask:
        paths += request_dumps(job, paths, environs=environs, probes=probes)
    return _analyse(job, paths, environs, sockets=ask)


def _loaded(
    job: Job, paths: list[Path], environs: Mapping[int, dict[str, str]], *, sockets: bool
) -> tuple[list[LoadedDump], list[RankError]]:
    """The dumps at ``paths`` (and, with ``sockets``, the worker sockets' traces of the ranks without
    one), read, with the errors of those that could not be."""
    dumps, errors = read_dumps([os.fspath(p) for p in paths]) if paths else ([], [])
    if sockets:
        have = {d.rank for d in dumps}
        for rank, sock in _worker_sockets(job, environs).items():
            if rank in have:
                continue
            trace = worker_trace(sock)
            if trace is not None:
                dumps.append(LoadedDump(path=f"{sock} (fr_trace_json)", rank=rank, format="json", data=trace))
    return dumps, errors


def _analyse(
    job: Job, paths: list[Path], environs: Mapping[int, dict[str, str]], *, sockets: bool
) -> FlightReport | None:
    """The dumps at ``paths`` (and the worker sockets' traces) analysed together; None when there are none."""
    dumps, errors = _loaded(job, paths, environs, sockets=sockets)
    return analyze_flight(dumps, errors, world_size=job.world_size) if dumps else None


def pick_up_fresh(
    job: Job, *, environs: Mapping[int, dict[str, str]], probes: Mapping[int, Probe]
) -> tuple[FlightReport | None, FlightReport | None]:
    """The recorder at the start of a progress window, asked of the ranks once: every rank that
    opened a channel is asked for a fresh dump (whether or not it wrote one already), and the
    answer is both the capture's recorder (with this run's older dumps of the ranks that did not
    answer) and the window's first end (only the fresh dumps: an older one would make a hung job
    look as if it moved between the ends)."""
    fresh = request_dumps(job, [], environs=environs, probes=probes)
    older = [p for p in find_dumps(job, environs, probes) if p not in fresh]
    dumps, errors = _loaded(job, fresh, environs, sockets=True)
    old, old_errors = _loaded(job, older, environs, sockets=False)
    have = {d.rank for d in dumps}
    every = [*dumps, *(d for d in old if d.rank not in have)]
    flight = analyze_flight(every, [*errors, *old_errors], world_size=job.world_size) if every else None
    start = analyze_flight(dumps, errors, world_size=job.world_size) if dumps else None
    return flight, start


def ask_again(
    job: Job, *, environs: Mapping[int, dict[str, str]], probes: Mapping[int, Probe]
) -> FlightReport | None:
    """A fresh dump from every rank that opened a channel, whether or not it wrote one already: the
    recorder at the end of a window, to compare with the one at its start."""
    return _analyse(job, request_dumps(job, [], environs=environs, probes=probes), environs, sockets=True)


__all__ = [
    "EXCEPTION_DUMP",
    "Probe",
    "ask_again",
    "debug_server_flight",
    "dump_path",
    "exception_dump_note",
    "find_dumps",
    "find_probes",
    "has_channel",
    "pick_up",
    "pick_up_fresh",
    "probe_of",
    "read_exception_dump",
    "recorder_plan",
    "request_dumps",
    "worker_servers",
    "worker_trace",
]
