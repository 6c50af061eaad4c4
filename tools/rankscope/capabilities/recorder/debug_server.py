"""PyTorch's debug server (``torch.distributed.debug.start_debug_server``): each rank's stacks and
recorder trace over HTTP, with no ssh at all.

``start_debug_server`` registers each rank's worker server in the job's TCPStore
(``debug_server/rank<R>`` = ``http://host:port``). This client finds them there and asks each for
its Python stacks (``dump_traceback``) and its flight-recorder trace (``fr_trace_json``). Two
callers: ``rankscope stacks --via debug-server`` (:func:`debug_server_look`, judged by
through :func:`rankscope.capabilities.remote.dump_stacks_remote`), and the recorder pickup of a
local capture whose verdict is still unsure (:mod:`rankscope.capabilities.recorder.pickup`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rankscope.analysis.hostlist import host_port
from rankscope.errors import InvalidInput
from rankscope.models.core import Frame, Job, RankError, RankProcess, RankStack, ThreadStack
from rankscope.models.look import HostLook
from rankscope.options import DEFAULTS, OPTION_FLAGS, DumpOptions, StacksTarget
from rankscope.runtime import net, tcpstore

log = logging.getLogger("rankscope.capabilities.recorder.debug_server")

MAX_OUTPUT = 64 << 20
"""The most bytes read of one worker server's answer."""

DEBUG_PREFIX = "debug_server"
"""start_debug_server registers each rank's worker as ``debug_server/rank<R>`` = ``http://host:port``."""

_FH_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<func>.*)$')


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """Threads from faulthandler's text (what the worker server's ``dump_traceback`` returns).

    The main thread is the one whose outermost frame is ``<module>`` (else the last
    listed); the "Current thread" is the server's own and is dropped when it has no
    Python frame.
    """
    threads: list[ThreadStack] = []
    current: ThreadStack | None = None
    is_server = False
    for line in text.splitlines():
        head = _FH_HEADER.match(line)
        if head:
            if current is not None and not (is_server and not current.frames):
                threads.append(current)
            current = ThreadStack(thread_id=int(head.group(2), 16))
            is_server = head.group(1) == "Current thread"
            continue
        m = _FH_FRAME.match(line)
        if m and current is not None:
            ln = m.group("line")
            current.frames.append(
                Frame(function=m.group("func"), file=m.group("file"), line=int(ln) if ln.isdigit() else None)
            )
    if current is not None and not (is_server and not current.frames):
        threads.append(current)
    main = next((t for t in threads if t.frames and t.frames[-1].function == "<module>"), None)
    if main is None and threads:
        main = threads[-1]
    return [t.model_copy(update={"is_main": t is main}) for t in threads]


def store_address(hosts: Sequence[str] | None, job: str | None, env: Mapping[str, str]) -> tuple[str, int]:
    """The job's TCPStore: ``--hosts ADDR:PORT``, ``--job ADDR:PORT``, or MASTER_ADDR/MASTER_PORT."""
    spec = (hosts[0] if hosts else None) or job
    if spec is None and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        spec = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    where = host_port(spec or "")
    if where is None:
        raise InvalidInput(
            f"--via debug-server needs the job's store as ADDR:PORT, got {spec!r}",
            "Pass --hosts MASTER_ADDR:MASTER_PORT (the torchrun rendezvous address), or set MASTER_ADDR/MASTER_PORT.",
        )
    return where


def _debug_server_rank(
    rank: int, url: str, options: DumpOptions
) -> tuple[RankStack, RankError | None, dict[str, Any] | None]:
    """One rank's stack from its worker server, and its recorder trace unless the options say no."""
    timeout = options.timeout
    host = re.sub(r"^https?://|:\d+/?$", "", url)
    try:
        text = net.http_post(f"{url}/handler/dump_traceback", timeout, MAX_OUTPUT).decode(errors="replace")
    except Exception as exc:  # URLError, timeout, reset: one rank's failure never hides the others
        kind = "timeout" if "timed out" in str(exc) else "unreachable"
        err = RankError(
            rank=rank,
            host=host,
            kind=kind,
            message=f"rank {rank}: debug server at {url} did not answer: {exc}",
            fix="Check that this machine can reach the worker's host and port (firewalls), or use --via ssh.",
        )
        return RankStack(rank=rank, pid=0, host=host, error=err), err, None
    stack = RankStack(rank=rank, pid=0, host=host, state="unknown", threads=parse_faulthandler(text))
    return stack, None, debug_server_trace(url, timeout) if options.flight_recorder else None


def debug_server_urls(addr: str, port: int, timeout: float) -> list[str]:
    """Each rank's worker-server URL that ``start_debug_server`` registered in the job's TCPStore
    (``debug_server/rank<R>``), in rank order; [] when none is registered.

    Raises TorchMissing without torch (its TCPStore client is the only one that speaks the
    store's protocol) and InvalidInput when the store does not answer.
    """
    try:
        return tcpstore.rank_values(addr, port, DEBUG_PREFIX, timeout)
    except ImportError as exc:
        from rankscope.errors import TorchMissing

        raise TorchMissing("Reading the job's TCPStore needs torch.") from exc
    except OSError as exc:
        raise InvalidInput(
            f"cannot connect to the job's TCPStore at {addr}:{port}: {str(exc).splitlines()[0]}",
            "Pass the rendezvous address (torchrun's --master_addr:--master_port) of a job that is still running.",
        ) from exc


def debug_server_trace(url: str, timeout: float) -> dict[str, Any] | None:
    """A rank's recorder trace from its worker server (``fr_trace_json``); None when it does not answer."""
    import json

    try:
        loaded = json.loads(net.http_post(f"{url}/handler/fr_trace_json", timeout, MAX_OUTPUT))
    except Exception as exc:  # URLError, timeout, reset, bad JSON: the recorder is optional evidence
        log.info("debug server %s: no recorder trace: %s", url, exc)
        return None
    return loaded if isinstance(loaded, dict) else None


DEBUG_SERVER_LIMITS: dict[str, str] = {
    "native": "its stacks are Python frames only (faulthandler)",
    "locals": "it gives no local variables",
    "nonblocking": "it never pauses the ranks anyway",
    "counters": "it gives no locals to read counters from",
    "ras": "NCCL RAS is read on the ranks' own hosts only (--via ssh, srun or kubectl)",
    "window": "it takes one look per rank",
}
"""What the debug server cannot do of each option it does not apply itself (it applies ``timeout``
and ``flight_recorder``); an option asked for beyond the defaults is named in the answer's notes
with its reason, never dropped without a word."""


def _debug_server_note(options: DumpOptions) -> str:
    """The job note of a debug-server collection: no pids, and each asked-for option it cannot apply."""
    note = "collected via PyTorch's debug server: pids are not reported (0)"
    asked = [
        f"{OPTION_FLAGS[f.name]}: {DEBUG_SERVER_LIMITS[f.name]}"
        for f in dataclasses.fields(DumpOptions)
        if f.name in DEBUG_SERVER_LIMITS and getattr(options, f.name) != f.default
    ]
    return f"{note}; not applied: {'; '.join(asked)}" if asked else note


def debug_server_look(target: StacksTarget, options: DumpOptions = DEFAULTS) -> HostLook:
    """Stacks (and, unless ``options.flight_recorder`` is off, flight-recorder traces) of every rank
    through their PyTorch debug servers, found in the store ``target.hosts[0]`` or ``target.job``
    (else MASTER_ADDR:MASTER_PORT): evidence, not a verdict. The caller judges it
    (:func:`rankscope.capabilities.remote.dump_stacks_remote`), so this client, which the recorder
    pickup asks for traces, never imports the judge that asks the pickup."""
    addr, port = store_address(target.hosts, target.job, os.environ)
    urls = debug_server_urls(addr, port, min(options.timeout, 15.0))
    if not urls:
        raise InvalidInput(
            f"no debug server registered in the store at {addr}:{port} (no '{DEBUG_PREFIX}/rank0' key)",
            "Start it in the training script: torch.distributed.debug.start_debug_server() after "
            "init_process_group; or use --via ssh.",
        )
    with ThreadPoolExecutor(max_workers=min(64, len(urls))) as pool:
        results = list(pool.map(lambda ru: _debug_server_rank(ru[0], ru[1], options), enumerate(urls)))
    stacks = [s for s, _, _ in results]
    errors = [e for _, e, _ in results if e is not None]
    hosts_seen = list(dict.fromkeys(s.host for s in stacks))
    ranks = [
        RankProcess(rank=s.rank, pid=0, host=s.host, rank_source="debug_server")
        for s in stacks
        if s.error is None
    ]
    job_model = Job(
        job_id=f"{addr}:{port}",
        world_size=len(urls),
        master_addr=addr,
        master_port=port,
        hosts=hosts_seen,
        ranks=ranks,
        notes=[_debug_server_note(options)],
    )
    from rankscope.analysis.recorder.flight import LoadedDump
    from rankscope.analysis.recorder.flight import analyze as analyze_flight

    dumps = [
        LoadedDump(path=f"{urls[i]}/handler/fr_trace_json", rank=i, format="json", data=t)
        for i, (_, _, t) in enumerate(results)
        if t
    ]
    flight = analyze_flight(dumps, world_size=len(urls)) if dumps else None
    return HostLook(host=f"{addr}:{port}", job=job_model, stacks=stacks, errors=errors, flight=flight)


__all__ = [
    "DEBUG_PREFIX",
    "DEBUG_SERVER_LIMITS",
    "debug_server_look",
    "debug_server_trace",
    "debug_server_urls",
    "parse_faulthandler",
    "store_address",
]
