"""Find the ranks of distributed PyTorch jobs on this host, from /proc alone.

How a process is recognised as a rank, in order:

* ``RANK`` in its environment (torchrun / torch.distributed.run, accelerate, deepspeed,
  any launcher that sets it), ``OMPI_COMM_WORLD_RANK`` / ``PMI_RANK`` (mpirun) or
  ``SLURM_PROCID`` (srun) - only for Python processes, so a shell wrapper is never a rank;
* torch.multiprocessing.spawn children, which have no rank variable: a Python process
  started as ``python -c "from multiprocessing.spawn import spawn_main; ..."`` whose parent
  has torch loaded. Their rank is the spawn index. ``start_processes`` starts the children
  one after another in index order, so the index is read from the start order (start time,
  then pid) here; ``rankscope.capabilities.stacks`` confirms it from the ``i`` argument of
  ``torch.multiprocessing.spawn._wrap`` in the child's stack.

A candidate with a candidate ancestor is not a rank but a child of that rank (a DataLoader
worker inherits RANK from its rank; a forked one even has the same command line).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.analysis.hang.backend import job_backend_of, rank_backend
from rankscope.analysis.launcher_args import launcher_kind, torchrun_settings
from rankscope.analysis.ranges import rank_ranges, ranks_phrase
from rankscope.analysis.redact import Redactor
from rankscope.analysis.startup import INIT, RENDEZVOUS
from rankscope.errors import NoJobsFound, NotADistributedJob, PermissionDenied, ProcessNotFound
from rankscope.models.core import Backend, Job, JobList, LauncherKind, MissingRank, ProcState, RankProcess
from rankscope.models.look import ChosenBy, JobChoice
from rankscope.options import check_pid
from rankscope.runtime import procfs
from rankscope.runtime.procfs import proc_state, read_cmdline, read_environ, read_stat

SPAWN_MARKER = "from multiprocessing.spawn import spawn_main"


@dataclass
class ProcInfo:
    """What /proc says about one process (fields empty when unreadable)."""

    pid: int
    ppid: int | None
    state: ProcState
    start_time: int
    cmdline: list[str]
    env: dict[str, str] | None
    env_denied: bool = False
    exe: str | None = None
    children: list[int] = field(default_factory=list)

    @property
    def is_python(self) -> bool:
        names = [os.path.basename(self.exe or ""), os.path.basename(self.cmdline[0]) if self.cmdline else ""]
        return any(n.startswith("python") or n.startswith("pypy") for n in names)


def read_proc(pid: int) -> ProcInfo | None:
    stat = read_stat(pid)
    if stat is None:
        return None
    ppid, state, start = stat
    env: dict[str, str] | None = None
    denied = False
    try:
        env = procfs.environ(pid)
    except PermissionError:
        denied = True
    except OSError:
        pass
    return ProcInfo(pid, ppid, state, start, read_cmdline(pid), env, denied, procfs.read_exe(pid))


def _has_torch(pid: int) -> bool:
    """True when the process has libtorch mapped (cheap check, no ptrace)."""
    return procfs.maps_mention(pid, (b"libtorch", b"torch/_C"))


def _int(env: dict[str, str], *names: str) -> tuple[int | None, str]:
    for name in names:
        value = env.get(name)
        if value is not None:
            try:
                return int(value), name
            except ValueError:
                continue
    return None, ""


@dataclass
class _Candidate:
    info: ProcInfo
    launcher: LauncherKind
    rank: int | None
    rank_source: str
    local_rank: int | None
    world_size: int | None
    key: tuple[str, ...]


LAUNCHER_WORDS = frozenset(
    {
        "torchrun",
        "torch.distributed.run",
        "torch.distributed.launch",
        "accelerate",
        "deepspeed",
        "deepspeed.launcher.launch",
        "deepspeed.launcher.runner",
    }
)
"""Launcher processes: never ranks, even when RANK leaked into their environment."""


def _is_launcher(cmdline: list[str]) -> bool:
    return any(os.path.basename(w) in LAUNCHER_WORDS for w in cmdline[:3])


def _is_rankscope(cmdline: list[str]) -> bool:
    """rankscope itself (``rankscope ...``, ``python -m rankscope ...``): never a rank, though a call
    that ``srun --overlap`` started on a node has SLURM_PROCID and SLURM_STEP_ID like one."""
    return "rankscope" in {os.path.basename(w) for w in cmdline[:2]} or cmdline[1:3] == ["-m", "rankscope"]


def _classify(info: ProcInfo, procs: dict[int, ProcInfo]) -> _Candidate | None:
    """Decide whether a process looks like a rank (before the worker filter)."""
    env = info.env or {}
    if not info.is_python or _is_launcher(info.cmdline):
        return None
    world, _ = _int(env, "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
    local, _ = _int(env, "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    key: tuple[str, ...]
    if "RANK" in env:
        rank, src = _int(env, "RANK")
        if "TORCHELASTIC_RUN_ID" in env:
            # one job = one rendezvous: several agents of it (--nnodes>1 on one host) are one job
            key = ("torchrun", env.get("TORCHELASTIC_RUN_ID", ""), addr, port)
            return _Candidate(info, "torchrun", rank, "env:RANK", local, world, key)
        launcher: LauncherKind = "env"
        if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
            launcher = "mpi"
        elif "SLURM_PROCID" in env:
            launcher = "slurm"
        key = (launcher, env.get("SLURM_JOB_ID", ""), env.get("SLURM_STEP_ID", ""), addr, port, str(world))
        return _Candidate(info, launcher, rank, "env:RANK", local, world, key)
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        rank, src = _int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK")
        job = (
            env.get("OMPI_MCA_orte_jobfam_session_dir")
            or env.get("PMIX_NAMESPACE")
            or env.get("PMI_JOBID", "")
        )
        return _Candidate(info, "mpi", rank, f"env:{src}", local, world, ("mpi", job, addr, port, str(world)))
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        rank, src = _int(env, "SLURM_PROCID")
        key = ("slurm", env.get("SLURM_JOB_ID", ""), env.get("SLURM_STEP_ID", ""))
        return _Candidate(info, "slurm", rank, f"env:{src}", local, world, key)
    if any(SPAWN_MARKER in w for w in info.cmdline) and info.ppid in procs:
        parent = procs[info.ppid]
        if parent.is_python and (_has_torch(info.ppid) or _has_torch(info.pid)):
            return _Candidate(info, "mp_spawn", None, "spawn_order", None, None, ("mp_spawn", str(info.ppid)))
    return None


def _hostname() -> str:
    return socket.gethostname()


def this_host() -> str:
    """This host's name, as the ranks found here are named."""
    return _hostname()


def scan() -> dict[int, ProcInfo]:
    """One pass over /proc: every process with its parent, state, cmdline and environment."""
    procs: dict[int, ProcInfo] = {}
    for pid in procfs.pids():
        info = read_proc(pid)
        if info is not None:
            procs[info.pid] = info
    for info in procs.values():
        if info.ppid in procs:
            procs[info.ppid].children.append(info.pid)
    return procs


def _ancestors(pid: int, procs: dict[int, ProcInfo]) -> list[int]:
    out: list[int] = []
    cur = procs[pid].ppid if pid in procs else None
    while cur and cur in procs and cur not in out:
        out.append(cur)
        cur = procs[cur].ppid
    return out


def _descendants(pid: int, procs: dict[int, ProcInfo]) -> list[int]:
    out: list[int] = []
    todo = list(procs[pid].children) if pid in procs else []
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(procs[p].children if p in procs else [])
    return out


def build_jobs(procs: dict[int, ProcInfo], host: str, redactor: Redactor | None = None) -> list[Job]:
    """Group the rank processes found in a /proc snapshot into jobs."""
    redactor = redactor or Redactor()
    cands: dict[int, _Candidate] = {}
    for info in procs.values():
        if info.state in ("zombie", "dead") or _is_rankscope(info.cmdline):
            continue
        c = _classify(info, procs)
        if c is not None:
            cands[info.pid] = c
    ranks = {pid: c for pid, c in cands.items() if not any(a in cands for a in _ancestors(pid, procs))}
    by_key: dict[tuple[str, ...], list[_Candidate]] = defaultdict(list)
    for c in ranks.values():
        by_key[c.key].append(c)
    jobs: list[Job] = []
    for key, members in by_key.items():
        jobs.append(_make_job(key, members, procs, host, redactor))
    jobs.extend(launcher_jobs(procs, set(cands), host, redactor))
    jobs.sort(key=lambda j: min((r.pid for r in j.ranks), default=j.launcher_pid or 0))
    return jobs


def launcher_jobs(procs: dict[int, ProcInfo], ranks: set[int], host: str, redactor: Redactor) -> list[Job]:
    """Jobs that have launchers and no rank yet: torchrun agents waiting in rendezvous (those of
    one rendezvous on this host are one job), an mpirun before its ranks. A launcher with a rank
    below it belongs to that rank's job."""
    above = {a for pid in ranks for a in _ancestors(pid, procs)}
    groups: dict[tuple[str, ...], list[tuple[ProcInfo, dict[str, str]]]] = defaultdict(list)
    for info in procs.values():
        if info.pid in above or info.state in ("zombie", "dead") or _is_rankscope(info.cmdline):
            continue
        kind = launcher_kind(info.cmdline)
        if kind is None or any(launcher_kind(procs[a].cmdline) for a in _ancestors(info.pid, procs)):
            continue  # not a launcher, or one started by another launcher (counted there)
        if info.env_denied and any(procs[c].env_denied for c in _descendants(info.pid, procs) if c in procs):
            continue  # another user's job whose ranks cannot be read: not one in start-up (say denied)
        settings = launcher_settings(kind, info.cmdline, info.env or {})
        key = (
            (kind, settings.get("store", ""), settings.get("rdzv_id", ""))
            if kind == "torchrun"
            else (kind, str(info.pid))
        )
        groups[key].append((info, settings))
    return [_launcher_job(members, procs, host, redactor) for members in groups.values()]


def launcher_settings(kind: str, cmdline: list[str], env: dict[str, str]) -> dict[str, str]:
    """What a launcher was told (torchrun's settings; mpirun's process count as its world size)."""
    if kind == "torchrun":
        return torchrun_settings(cmdline, env)
    for flag in ("-np", "-n", "--np", "-c"):
        if flag in cmdline[:-1]:
            value = cmdline[cmdline.index(flag) + 1]
            return {"world_size": value} if value.isdigit() else {}
    return {}


def _launcher_job(
    members: list[tuple[ProcInfo, dict[str, str]]], procs: dict[int, ProcInfo], host: str, redactor: Redactor
) -> Job:
    info, settings = members[0]
    kind = launcher_kind(info.cmdline) or "torchrun"
    for member, _ in members:
        if member.env:
            redactor.learn_env(member.env)
    pids = sorted(m.pid for m, _ in members)
    port = settings.get("master_port", "")
    rdzv_id = settings.get("rdzv_id", "none")
    if kind != "torchrun":
        job_id = f"mpi:pid{pids[0]}"
    elif rdzv_id != "none":
        job_id = f"torchrun:{rdzv_id}"
    else:
        job_id = f"torchrun:{settings.get('store', f'pid{pids[0]}')}"
    world = settings.get("world_size", "")
    told = ", ".join(
        f"--{k}={settings[k]}" for k in ("nnodes", "node_rank", "nproc_per_node") if k in settings
    )
    where = f" at {settings['store']}" if "store" in settings else ""
    note = f"{RENDEZVOUS}: no rank started yet; {kind} pid(s) {', '.join(map(str, pids))} wait{where}" + (
        f" ({told})" if told else ""
    )
    return Job(
        job_id=job_id,
        launcher="torchrun" if kind == "torchrun" else "mpi",
        launcher_pid=pids[0],
        launcher_pids=pids,
        world_size=int(world) if world.isdigit() else None,
        master_addr=settings.get("master_addr"),
        master_port=int(port) if port.isdigit() else None,
        hosts=[host],
        notes=[note, *_zombie_notes(pids, procs)],
    )


def _make_job(
    key: tuple[str, ...], members: list[_Candidate], procs: dict[int, ProcInfo], host: str, redactor: Redactor
) -> Job:
    launcher: LauncherKind = members[0].launcher
    notes: list[str] = []
    if launcher == "mp_spawn":
        _number_spawn_ranks(members, notes)
    for c in members:
        if c.info.env:
            redactor.learn_env(c.info.env)
    env0 = members[0].info.env or {}
    world = next((c.world_size for c in members if c.world_size), None)
    agents = sorted({c.info.ppid for c in members if c.info.ppid is not None})
    members = _drop_stale_attempts(members, notes) if launcher == "torchrun" else members
    launcher_pid = _launcher_of(launcher, members)
    per_rank = read_backends(members)
    rank_procs = [
        _rank_process(c, host, launcher, redactor, procs, per_rank)
        for c in sorted(members, key=lambda c: (c.rank is None, c.rank or 0, c.info.pid))
    ]
    # mp.spawn: nprocs is known only to the parent; rankscope.capabilities.stacks reads it from its stack.
    found = {r.rank for r in rank_procs if r.rank is not None}
    missing = sorted(set(range(world)) - found) if world else []
    classified = classify_missing(members, missing, procs) if launcher == "torchrun" else []
    exited = [m.rank for m in classified if m.status == "exited"]
    if exited:
        notes.append(
            f"{ranks_phrase(exited)} of this host's torchrun agent(s) "
            f"{'is' if len(exited) == 1 else 'are'} gone: exited"
        )
    launchers = agents if launcher == "torchrun" else ([launcher_pid] if launcher_pid is not None else [])
    notes.extend(_zombie_notes(launchers, procs))
    port, _ = _int(env0, "MASTER_PORT")
    addr = env0.get("MASTER_ADDR")
    backend, backend_evidence = job_backend_of(per_rank)
    notes.extend(_init_state(per_rank, rank_procs))
    return Job(
        job_id=_job_id(launcher, env0, launcher_pid, addr, port),
        launcher=launcher,
        launcher_pid=launcher_pid,
        world_size=world,
        master_addr=addr,
        master_port=port,
        hosts=[host],
        ranks=rank_procs,
        missing_ranks=missing,
        exited_ranks=exited,
        notes=notes,
        backend=backend,
        backend_evidence=backend_evidence,
        launcher_pids=launchers,
        attempt=_attempt(members[0]) if launcher == "torchrun" else None,
        missing=classified or [MissingRank(rank=r, status="not_visible", detail=_NOT_HERE) for r in missing],
    )


def _init_state(per_rank: dict[int, tuple[Backend, list[str]]], ranks: list[RankProcess]) -> list[str]:
    """The note ``starting: init`` when some rank has torch loaded and holds
    no process group yet (no gloo or NCCL thread): before or in ``init_process_group``, where the
    others wait for it; the stacks say which."""
    early = [
        r.rank
        for r in ranks
        if r.pid in per_rank and per_rank[r.pid][0] == "unknown" and _has_torch(r.pid) and r.rank is not None
    ]
    if not early:
        return []
    verb = "holds" if len(early) == 1 else "hold"
    return [f"{INIT}: {ranks_phrase(early)} {verb} no process group yet (no gloo or NCCL thread)"]


def _number_spawn_ranks(members: list[_Candidate], notes: list[str]) -> None:
    members.sort(key=lambda c: (c.info.start_time, c.info.pid))
    for i, c in enumerate(members):
        c.rank, c.local_rank = i, i
    notes.append(
        "torch.multiprocessing.spawn ranks: numbered by start order here; `rankscope stacks` reads the "
        "spawn index from each rank's stack"
    )


def _drop_stale_attempts(members: list[_Candidate], notes: list[str]) -> list[_Candidate]:
    members, stale = _latest_attempt(members)
    if stale:
        notes.append(
            f"pids {sorted(c.info.pid for c in stale)} are ranks of an earlier torchrun attempt still alive: "
            "left out (ranks of two attempts never meet in a collective)"
        )
    return members


def _launcher_of(launcher: LauncherKind, members: list[_Candidate]) -> int | None:
    if launcher == "torchrun":
        return _first_agent(members)
    if launcher == "mp_spawn":
        return members[0].info.ppid
    parents = {c.info.ppid for c in members}
    return parents.pop() if len(parents) == 1 else None


def _rank_process(
    c: _Candidate,
    host: str,
    launcher: LauncherKind,
    redactor: Redactor,
    procs: dict[int, ProcInfo],
    per_rank: dict[int, tuple[Backend, list[str]]],
) -> RankProcess:
    return RankProcess(
        rank=c.rank,
        local_rank=c.local_rank,
        pid=c.info.pid,
        host=host,
        state=c.info.state,
        launcher=launcher,
        rank_source=c.rank_source,
        cmdline=redactor.argv(c.info.cmdline),
        python=c.info.exe,
        children=_descendants(c.info.pid, procs),
        backend=per_rank[c.info.pid][0] if c.info.pid in per_rank else None,
    )


def _zombie_notes(launchers: list[int], procs: dict[int, ProcInfo]) -> list[str]:
    ended = [u for agent in launchers for u in _unreaped(agent, procs)]
    if not ended:
        return []
    how = [f"pid {p}" + (f" ({procfs.ended_phrase(code)})" if code is not None else "") for p, code in ended]
    return [f"exited children of the launcher not yet reaped (zombies): {', '.join(how)}"]


_NOT_HERE = "not on this host: collect the other hosts' ranks (stacks --hosts ..., dump_stacks hosts=[...])"


def _attempt(c: _Candidate) -> int | None:
    value, _ = _int(c.info.env or {}, "TORCHELASTIC_RESTART_COUNT")
    return value


def _latest_attempt(members: list[_Candidate]) -> tuple[list[_Candidate], list[_Candidate]]:
    """The ranks of the newest torchrun attempt, and those of older attempts still alive."""
    attempts = {_attempt(c) for c in members}
    if len(attempts) <= 1:
        return members, []
    latest = max(a for a in attempts if a is not None)
    return [c for c in members if _attempt(c) == latest], [c for c in members if _attempt(c) != latest]


def _first_agent(members: list[_Candidate]) -> int | None:
    """The torchrun agent of node 0 (GROUP_RANK=0) when it runs here, else the lowest agent pid."""
    for c in members:
        if (c.info.env or {}).get("GROUP_RANK") == "0" and c.info.ppid is not None:
            return c.info.ppid
    agents = sorted({c.info.ppid for c in members if c.info.ppid is not None})
    return agents[0] if agents else None


def classify_missing(
    members: list[_Candidate], missing: list[int], procs: dict[int, ProcInfo] | None = None
) -> list[MissingRank]:
    """Each missing rank of a torchrun job: started here by one of its agents (then exited) or elsewhere.

    An agent started ranks ``RANK - LOCAL_RANK + [0, LOCAL_WORLD_SIZE)``; a rank of that range
    that is gone exited. Any other rank runs on another host: not visible, not blamable. An
    agent's unreaped children say how they ended; when one rank of an agent is gone and one
    child is unreaped, that is the rank, and its exit code is known.
    """
    started: dict[int, int] = {}
    attempt_dirs: dict[int, tuple[Path, int]] = {}
    for c in members:
        env = c.info.env or {}
        lws, _ = _int(env, "LOCAL_WORLD_SIZE")
        if lws is None or c.rank is None or c.local_rank is None or c.info.ppid is None:
            continue
        base = c.rank - c.local_rank
        error_file = env.get("TORCHELASTIC_ERROR_FILE")
        for r in range(base, base + lws):
            started.setdefault(r, c.info.ppid)
            if error_file and r not in attempt_dirs:
                attempt_dirs[r] = (Path(error_file).parent.parent, r - base)
    gone_by_agent: dict[int, list[int]] = defaultdict(list)
    for r in missing:
        if r in started:
            gone_by_agent[started[r]].append(r)
    out: list[MissingRank] = []
    for r in missing:
        if r not in started:
            out.append(MissingRank(rank=r, status="not_visible", detail=_NOT_HERE))
            continue
        agent = started[r]
        ended = _unreaped(agent, procs or {})
        detail = f"started by torchrun agent pid {agent} on this host and gone"
        code: int | None = None
        told = [(p, c) for p, c in ended if c is not None]
        if told:
            detail += " (unreaped: " + ", ".join(f"pid {p} {procfs.ended_phrase(c)}" for p, c in told) + ")"
            if len(told) == 1 and len(gone_by_agent[agent]) == 1:
                code = told[0][1]
        words = last_words(*attempt_dirs[r]) if r in attempt_dirs else None
        detail += f"; {words}" if words else "; its logs say why"
        out.append(MissingRank(rank=r, status="exited", exit_code=code, detail=detail))
    return out


LAST_WORDS_BYTES = 64 * 1024
_EXIT_NOISE = re.compile(r"terminate called without an active exception")
"""What libstdc++ prints when a process exits with C++ threads still joinable (gloo's, NCCL's): it
follows whatever the rank said last and says nothing of why it left."""

_ERROR_LINE = re.compile(
    r"(Error|Exception|error:|Traceback|Killed|Signal \d+|exit(ed)? with)", re.IGNORECASE
)


def last_words(attempt_dir: Path, local_rank: int) -> str | None:
    """What a rank torchrun started left in its log folder: the message of its ``error.json``
    (written by scripts under ``@record``), else the last error line of its ``stderr.log`` (with
    ``--redirects``/``--tee``). The folder is ``<log dir>/<run>/attempt_<N>/<local rank>``, read off
    a live sibling's ``TORCHELASTIC_ERROR_FILE``."""
    folder = attempt_dir / str(local_rank)
    message = _error_json_message(folder / "error.json")
    if message:
        return f"{folder / 'error.json'}: {message}"
    line = _last_error_line(folder / "stderr.log")
    return f"{folder / 'stderr.log'}: {line}" if line else None


def _error_json_message(path: Path) -> str | None:
    try:
        data = json.loads(path.read_bytes()[:LAST_WORDS_BYTES])
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return _clip(lines[-1] if lines else message)


def last_error_line(path: Path) -> str | None:
    """The last line of a log file's last 64 KB that reads as an error; None when none does."""
    line = _last_error_line(path)
    return line if line is not None and _ERROR_LINE.search(line) else None


def _last_error_line(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LAST_WORDS_BYTES))
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not _EXIT_NOISE.search(ln)]
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return _clip(line)
    return _clip(lines[-1]) if lines else None


def _clip(line: str, limit: int = 240) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _unreaped(agent: int, procs: dict[int, ProcInfo]) -> list[tuple[int, int | None]]:
    """(pid, exit code or minus the signal; None when the kernel does not say) of the agent's
    exited children it has not reaped."""
    info = procs.get(agent)
    return [
        (p, procfs.exit_code(p))
        for p in (info.children if info else [])
        if p in procs and procs[p].state in ("zombie", "dead")
    ]


def read_backends(members: list[_Candidate]) -> dict[int, tuple[Backend, list[str]]]:
    """Each live rank's communication backend from its threads, maps and fds (no ptrace), by pid."""
    return {
        c.info.pid: rank_backend(procfs.process_signs(c.info.pid, c.info.env))
        for c in members
        if c.info.state not in ("zombie", "dead")
    }


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _job_id(
    launcher: str, env: dict[str, str], launcher_pid: int | None, addr: str | None, port: int | None
) -> str:
    """An id a person recognises. torchrun's run id is the ``--rdzv-id`` given (kept: the person chose
    it), ``none`` without one, or a uuid torchrun made up for a one-node run started without
    ``--master-port`` (``torchrun --nproc_per_node=4 train.py``, logged nowhere by default): for
    those two, the rendezvous address and port the ranks were given (``torchrun:localhost:29513``)."""
    if launcher == "torchrun":
        run_id = env.get("TORCHELASTIC_RUN_ID", "")
        if run_id and run_id != "none" and not (_UUID.fullmatch(run_id) and addr and port):
            return f"torchrun:{run_id}"
        return f"torchrun:{addr}:{port}" if addr and port else f"torchrun:pid{launcher_pid}"
    if launcher == "slurm" and env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"
    if launcher == "mp_spawn":
        return f"mp_spawn:pid{launcher_pid}"
    if addr and port:
        return f"{launcher}:{addr}:{port}"
    return f"{launcher}:pid{launcher_pid}"


@procfs.reading_once()
def list_jobs(pid: int | None = None) -> JobList:
    """Every distributed job on this host (or only the job of ``pid`` when given)."""
    host = _hostname()
    if pid is not None:
        return JobList(host=host, jobs=[find_job(pid)])
    procs = scan()
    errors: list[str] = []
    denied = [p.pid for p in procs.values() if p.env_denied and p.is_python]
    if denied:
        errors.append(
            f"{len(denied)} Python process(es) could not be inspected (permission denied on /proc/PID/environ): "
            "run as their user or root"
        )
    return JobList(host=host, jobs=build_jobs(procs, host), errors=errors)


def _job_of(pid: int, jobs: list[Job]) -> Job | None:
    """The job ``pid`` is part of: its launcher, one of its ranks, or a rank's child."""
    for job in jobs:
        if job.launcher_pid == pid or pid in job.launcher_pids:
            return job
        for r in job.ranks:
            if r.pid == pid or pid in r.children:
                return job
    return None


def _refuse_init(jobs: list[Job], procs: dict[int, ProcInfo]) -> NotADistributedJob:
    """init (pid 1), when it is no job's launcher (in a container it may be torchrun): it is above
    every job, and a job whose launcher's parent exited is reparented to it, so ``--pid 1`` was
    once taken for that job's launcher and the job dumped."""
    name = os.path.basename(procs[1].cmdline[0]) if 1 in procs and procs[1].cmdline else "unknown"
    here = f"jobs here: {describe_jobs(jobs)}" if jobs else "no job runs here now (`rankscope ps`)"
    return NotADistributedJob(
        f"pid 1 is init ({name}), the ancestor of every process here, not a rank or launcher of a "
        "distributed PyTorch job.",
        fix=f"Pass --pid with a launcher or rank pid (MCP: pid=), or --job JOB_ID; {here}.",
    )


def _job_below(pid: int, jobs: list[Job], procs: dict[int, ProcInfo]) -> Job | None:
    """The one job ``pid`` is an ancestor of (a wrapper between launcher and ranks; a shell script,
    srun or mpirun that started the launcher), said in its notes when ``pid`` is above the launcher.
    An ancestor of several jobs names none: refused, with the jobs."""
    below = [j for j in jobs if any(pid in _ancestors(r.pid, procs) for r in j.ranks)]
    if not below:
        return None
    what = _what(pid, procs)
    if len(below) > 1:
        raise NotADistributedJob(
            f"pid {pid} ({what}) is not a rank or launcher of a distributed PyTorch job but an ancestor of "
            f"{len(below)} of them: {describe_jobs(below)}.",
            fix="Pass --pid with a launcher or rank pid of the job to inspect (MCP: pid=), or --job JOB_ID.",
        )
    job = below[0]
    launchers = job.launcher_pids or ([job.launcher_pid] if job.launcher_pid is not None else [])
    if not any(pid in _ancestors(lp, procs) for lp in launchers):
        return job
    note = (
        f"pid {pid} ({what}) is not a rank or launcher of this job but an ancestor of its launcher "
        f"(pid {launchers[0]}): the only job below it was taken"
    )
    return job.model_copy(update={"notes": [*job.notes, note]})


def _what(pid: int, procs: dict[int, ProcInfo]) -> str:
    """A process as a person knows it: its command line, redacted and cut."""
    info = procs.get(pid)
    return " ".join(Redactor().argv(info.cmdline))[:200] if info and info.cmdline else f"pid {pid}"


def describe_jobs(jobs: list[Job]) -> str:
    """One line per job for an error that asks to pick one: id, world size, ranks, launchers, and
    the folder it was started in (what a person knows the job by)."""
    lines = []
    for j in jobs:
        here = rank_ranges(sorted(r.rank for r in j.ranks if r.rank is not None)) or "?"
        launchers = j.launcher_pids or ([j.launcher_pid] if j.launcher_pid else [])
        cwd = job_cwd(j)
        lines.append(
            f"{j.job_id} (world size {j.world_size or '?'}, ranks {here} here, launcher pid(s) "
            f"{', '.join(map(str, launchers)) or '?'}" + (f", started in {cwd}" if cwd else "") + ")"
        )
    return "; ".join(lines)


def job_cwd(job: Job) -> str | None:
    """The folder the job was started in: its launcher's working directory, else its first rank's."""
    for pid in [
        *job.launcher_pids,
        *([job.launcher_pid] if job.launcher_pid else []),
        *(r.pid for r in job.ranks),
    ]:
        if pid == 1:
            continue  # ranks a detached start left to init: the folder is theirs
        cwd = procfs.read_cwd(pid)
        if cwd is not None:
            return cwd
    return None


def _of_own_allocation(jobs: list[Job]) -> list[Job]:
    """The jobs whose ranks (or, before any rank started, launchers) run in the Slurm job this call
    runs in (its SLURM_JOB_ID): a call made in an allocation (``srun --overlap --jobid N`` on a
    node) means that job, not another one."""
    own = os.environ.get("SLURM_JOB_ID")
    if not own:
        return []
    return [
        j
        for j in jobs
        if any(
            (read_environ(pid) or {}).get("SLURM_JOB_ID") == own
            for pid in [r.pid for r in j.ranks[:1]] or j.launcher_pids[:1]
        )
    ]


def _started_here(jobs: list[Job], here: str) -> Job | None:
    """The one job of this call's own Slurm job, else the one started in ``here`` (or in a folder
    above it, "/" and the home folder aside): rankscope run from a job's folder means that job.
    None when no job or several match."""
    mine = _of_own_allocation(jobs)
    if len(mine) == 1:
        return mine[0]
    cwds = [(j, job_cwd(j)) for j in jobs]
    exact = [j for j, cwd in cwds if cwd == here]
    if exact:
        return exact[0] if len(exact) == 1 else None
    broad = {"/", os.path.expanduser("~")}
    above = [j for j, cwd in cwds if cwd and cwd not in broad and here.startswith(cwd.rstrip("/") + "/")]
    return above[0] if len(above) == 1 else None


def _no_job_fix() -> str:
    """First the commonest cause, checked in a second: another host or another user (this call's
    host and user named); then where a job that is not here runs: on a Slurm cluster (its login
    node has ``squeue``), on the nodes of a Slurm job, which one call reaches."""
    looked = f"rankscope looked on host {_hostname()} as user {_user()}. "
    if shutil.which("squeue") is None:
        return f"{NoJobsFound.check} {looked}{NoJobsFound.elsewhere}"
    return (
        f"{NoJobsFound.check} {looked}"
        'On a Slurm cluster: `rankscope stacks --via srun --job JOBID` (MCP: dump_stacks(via="srun", '
        f"job=JOBID); `squeue --me` lists your jobs). {NoJobsFound.elsewhere}"
    )


def _user() -> str:
    """This call's user name (its uid where the name is unknown)."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def _only_or_here(jobs: list[Job]) -> Job:
    """The only job; or, among several, the one of this call's Slurm job, else the one started in the
    current folder (said in its notes)."""
    if not jobs:
        raise NoJobsFound("No distributed PyTorch job found on this host.", fix=_no_job_fix())
    mine = _of_own_allocation(jobs)
    if len(jobs) == 1 or len(mine) == 1:
        return (mine or jobs)[0]
    try:
        here = os.getcwd()
    except OSError:
        here = ""
    chosen = _started_here(jobs, here) if here else None
    if chosen is None:
        raise NotADistributedJob(
            f"{len(jobs)} distributed jobs run on this host: {describe_jobs(jobs)}.",
            fix="Pass --job JOB_ID (MCP: job_id=) or --pid with a launcher or rank pid of the job to inspect, "
            "or run rankscope from the folder the job was started in.",
        )
    others = [j.job_id for j in jobs if j is not chosen]
    note = (
        f"{len(jobs)} jobs on this host: this one was started in the current folder; others: {', '.join(others)} "
        "(--job / job_id=)"
    )
    return chosen.model_copy(update={"notes": [*chosen.notes, note]})


def select_job(jobs: list[Job], job_id: str) -> Job:
    """The job whose id is ``job_id`` (or ends with it: ``29500`` picks ``torchrun:host:29500``)."""
    exact = [j for j in jobs if j.job_id == job_id]
    near = exact or [j for j in jobs if j.job_id.endswith(job_id) or j.job_id.split(":", 1)[-1] == job_id]
    if len(near) == 1:
        return near[0]
    if not near:
        raise ProcessNotFound(
            f"No job {job_id!r} on this host. Jobs here: {describe_jobs(jobs) or 'none'}.",
            fix="Pass job_id (CLI: --job) with one of the job ids above (list_jobs, rankscope ps list them).",
        )
    raise NotADistributedJob(
        f"{len(near)} jobs match {job_id!r}: {describe_jobs(near)}.", fix="Pass the full job id."
    )


def of_slurm_job(jobs: list[Job], procs: dict[int, ProcInfo], slurm_job: str | None) -> list[Job]:
    """The jobs whose ranks run in Slurm job ``slurm_job`` (their SLURM_JOB_ID): a call made in an
    allocation (``srun --overlap --jobid N`` on a node) means that job's ranks, not another job's."""
    if not slurm_job or not slurm_job.isdigit():
        return []
    return [
        j
        for j in jobs
        if any((procs[r.pid].env or {}).get("SLURM_JOB_ID") == slurm_job for r in j.ranks if r.pid in procs)
    ]


@procfs.reading_once()  # each stable fact once per call (maps: torch's, then the backend's)
def find_job(pid: int | None = None, job_id: str | None = None) -> Job:
    """The job that ``pid`` belongs to (launcher, rank, a rank's child), the job named ``job_id``,
    or the only job here."""
    host = _hostname()
    check_pid(pid)
    procs = scan()
    jobs = build_jobs(procs, host)
    if pid is None and job_id is not None:
        of_slurm = of_slurm_job(jobs, procs, job_id)
        return of_slurm[0] if len(of_slurm) == 1 else select_job(jobs, job_id)
    if pid is None:
        return _only_or_here(jobs)
    if pid not in procs:
        raise ProcessNotFound(f"No process with pid {pid} on this host (it may have exited).")
    job = _job_of(pid, jobs)
    if job is None and pid == 1:
        raise _refuse_init(jobs, procs)
    job = job or _job_below(pid, jobs, procs)
    if job is not None:
        return job
    info = procs[pid]
    what = _what(pid, procs)
    if info.env_denied:
        raise PermissionDenied(f"Cannot read /proc/{pid}/environ ({what}): permission denied.")
    if info.state in ("zombie", "dead"):
        raise ProcessNotFound(f"Process {pid} has exited (it is a zombie).")
    if not info.is_python:
        raise NotADistributedJob(f"Process {pid} ({what}) is not a Python process.")
    raise NotADistributedJob(
        f"Process {pid} ({what}) is a Python process but not part of a distributed PyTorch job "
        "(no RANK/SLURM_PROCID/OMPI_COMM_WORLD_RANK in its environment, and not a torch.multiprocessing.spawn child)."
    )


@procfs.reading_once()
def pick_job(
    pid: int | None, job_id: str | None, here: str | None
) -> tuple[Job | None, ChosenBy | None, list[JobChoice]]:
    """The job one host of a multi-host call inspects, and how it was picked: by ``pid`` or
    ``job_id`` (as :func:`find_job`), else the one started in ``here`` (the folder the call was
    made from, on the collecting host; by default this process's, as srun's steps start there),
    else the only job here. Several jobs and none picked:
    no job, and every job as a choice, so the collecting host lists them once for all hosts."""
    if pid is not None:
        return find_job(pid, None), "pid", []
    jobs = build_jobs(scan(), _hostname())
    if not jobs:
        raise NoJobsFound("No distributed PyTorch job found on this host.")
    if job_id is not None:
        return select_job(jobs, job_id), "job_id", []
    if here is None:  # srun starts a host's step in the caller's folder
        try:
            here = os.getcwd()
        except OSError:
            here = None
    chosen = _started_here(jobs, here) if here else None
    if chosen is not None:
        return chosen, "folder", []
    if len(jobs) == 1:
        return jobs[0], "only", []
    choices = [
        JobChoice(
            job_id=j.job_id,
            world_size=j.world_size,
            ranks=sorted(r.rank for r in j.ranks if r.rank is not None),
            launcher_pids=j.launcher_pids or ([j.launcher_pid] if j.launcher_pid else []),
            cwd=job_cwd(j),
        )
        for j in jobs
    ]
    return None, None, choices


__all__ = ["find_job", "list_jobs", "pick_job", "proc_state", "read_environ", "scan", "this_host"]
