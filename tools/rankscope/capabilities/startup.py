"""What one host reads of a job in start-up, for the verdict that compares the nodes.

A job that never started has no training stack to read; what decides is on each host: the
launchers' own arguments and environment (``--master_port``, ``--nnodes``, ``--rdzv_id``...),
whether anything listens at the store's port and which process (``/proc/net/tcp`` and the
processes' socket fds), and where the master's name resolves. A host with no launcher of the job
still says which Python processes listen here (a previous run's store holding the port). Read-only
and bounded: /proc, and one name lookup per name with a timeout.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rankscope.analysis.launcher_args import env_settings, launcher_kind, store_address, torchrun_settings
from rankscope.analysis.redact import Redactor
from rankscope.capabilities import discovery
from rankscope.models.core import Job
from rankscope.models.startup import LauncherFacts, Listener, StartupFacts
from rankscope.runtime import net, procfs

MAX_LISTENERS = 16
"""Listening sockets reported by a host that runs no launcher of the job, at most."""

RESOLVE_TIMEOUT_S = 1.0


def _command(pid: int) -> str | None:
    argv = procfs.read_cmdline(pid)
    text = " ".join(Redactor().argv(argv))
    return (text[:77] + "...") if len(text) > 80 else (text or None)


def _owners(inodes: set[int], first: Iterable[int]) -> dict[int, int]:
    """inode -> pid of the processes holding those sockets: the job's own processes first, then
    the host's other Python processes (a store is torch's: a job's, or a previous run's), until
    every inode is placed; the fds of other programs are never walked."""
    found: dict[int, int] = {}
    seen: set[int] = set()
    first = list(first)
    first_set = set(first)
    for pid in [*first, *procfs.pids()]:
        if len(found) == len(inodes):
            break
        if pid in seen:
            continue
        seen.add(pid)
        if pid not in first_set and "python" not in (procfs.read_exe(pid) or "").rsplit("/", 1)[-1]:
            continue
        for inode in procfs.socket_inodes(pid) & inodes:
            found[inode] = pid
    return found


def _listeners(host: str, ports: frozenset[int], job_pids: set[int]) -> list[Listener]:
    sockets = procfs.tcp_sockets(ports)
    listening = [s for s in sockets if s.listening and s.port in ports]
    owners = _owners({s.inode for s in listening}, sorted(job_pids))
    out = []
    for s in listening:
        pid = owners.get(s.inode)
        connections = sum(1 for c in sockets if c.established and c.port == s.port)
        out.append(
            Listener(
                host=host,
                port=s.port,
                address=s.local,
                pid=pid,
                command=_command(pid) if pid is not None else None,
                of_job=pid in job_pids,
                connections=connections,
            )
        )
    return out


def _python_listeners(host: str) -> list[Listener]:
    """The Python processes listening on a TCP port of 1024 or above here (a store of another job,
    or of a previous run), for a host that runs no launcher of the job."""
    listening = [s for s in procfs.tcp_sockets(None) if s.listening and s.port >= 1024]
    owners = _owners({s.inode for s in listening}, ())
    out = [
        Listener(
            host=host, port=s.port, address=s.local, pid=owners[s.inode], command=_command(owners[s.inode])
        )
        for s in listening
        if s.inode in owners
    ]
    return out[:MAX_LISTENERS]


def _log_line(pid: int) -> str | None:
    """``FILE: LINE``: the last error line of the regular file the launcher's output goes to (its
    stderr, else its stdout), where a node that exited may have said why, in a job log they share."""
    for target in procfs.output_files(pid):
        line = discovery.last_error_line(Path(target))
        if line:
            return f"{target}: {line}"
    return None


def _launchers(job: Job, host: str) -> list[LauncherFacts]:
    """The job's launchers here (torchrun agents, mpirun); or, for ranks started without one, the
    first rank's environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE) as this host's settings."""
    out = []
    for pid in job.launcher_pids or ([job.launcher_pid] if job.launcher_pid else []):
        info = discovery.read_proc(pid)
        kind = launcher_kind(info.cmdline) if info is not None else None
        if info is None or kind is None:
            continue
        settings = (
            torchrun_settings(info.cmdline, info.env or {})
            if kind == "torchrun"
            else discovery.launcher_settings(kind, info.cmdline, info.env or {})
        )
        ranks = sum(1 for r in job.ranks if procfs.parent_of(r.pid) == pid)
        facts = LauncherFacts(
            host=host, pid=pid, kind=kind, settings=settings, ranks=ranks, cwd=procfs.read_cwd(pid)
        )
        out.append(facts.model_copy(update={"log_line": _log_line(pid)}))
    if out or not job.ranks:
        return out
    first = job.ranks[0]
    env = procfs.read_environ(first.pid) or {}
    return [
        LauncherFacts(
            host=host,
            pid=first.pid,
            kind="ranks",
            settings=env_settings(env),
            ranks=len(job.ranks),
            cwd=procfs.read_cwd(first.pid),
        )
    ]


def startup_facts(job: Job | None) -> StartupFacts:
    """This host's facts for the start-up verdict: the job's launchers, who listens at their
    store's port, and where their master's name resolves; without a job here, the Python processes
    listening on a port (one of them may hold the store's)."""
    host = discovery.this_host()
    if job is None:
        return StartupFacts(host=host, listeners=_python_listeners(host))
    launchers = _launchers(job, host)
    stores = {a for lf in launchers if (a := store_address(lf.settings)) is not None}
    job_pids = {*job.launcher_pids, *(r.pid for r in job.ranks), *(c for r in job.ranks for c in r.children)}
    listeners = _listeners(host, frozenset(port for _, port in stores), job_pids) if stores else []
    names = sorted({name for name, _ in stores})
    exited = [f"{host}: rank {m.rank} exited: {m.detail}" for m in job.missing if m.status == "exited"]
    return StartupFacts(
        host=host,
        launchers=launchers,
        listeners=listeners,
        resolved={name: net.resolve(name, RESOLVE_TIMEOUT_S) for name in names},
        exited=exited,
    )


__all__ = ["startup_facts"]
