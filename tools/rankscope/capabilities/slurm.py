"""A Slurm job's nodes, asked of Slurm itself: what ``--via srun --job JOBID`` collects from.

A login node has no SLURM_JOB_NODELIST: the job's nodes, its state and its owner come from
``scontrol show job -o JOBID`` (one bounded call). A job that is not running, unknown to the
controller, or another user's is refused here, with what to do, before any ``srun`` step is
tried: ``srun --overlap --jobid`` into such a job fails with a message that says less.

A plain ``rankscope stacks`` on a Slurm cluster means a Slurm job too (:func:`slurm_target`):
the allocation it runs in or beside, or on a login node the running job submitted from the
current folder. rankscope's own ``srun`` runs without the caller's allocation variables
(:func:`srun_env`), which srun would take for its own.

Parsing is pure (:func:`parse_job_records`, :func:`job_nodes`, :func:`parse_workdirs`,
:func:`started_in`); :func:`slurm_job_nodes` and :func:`job_started_in` run scontrol and squeue.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence

from rankscope.analysis.hostlist import expand_hostlist
from rankscope.errors import (
    ExternalToolFailed,
    InvalidInput,
    SlurmJobNotFound,
    SlurmJobNotRunning,
    SlurmJobNotYours,
)
from rankscope.options import StacksTarget
from rankscope.runtime import subproc

SCONTROL_TIMEOUT = 10.0
"""Seconds ``scontrol`` gets: the controller answers in milliseconds when it is up."""

_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=(.*?)(?=\s[A-Za-z][\w/:]*=|$)")

FINISHED = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
"""Job states with no processes left to look at."""


def parse_job_records(text: str) -> list[dict[str, str]]:
    """``scontrol show job -o`` output: one record per line (an array or heterogeneous job has
    several), each ``Key=Value`` pair kept whole (a value such as StdOut may hold spaces)."""
    return [
        {m.group(1): m.group(2) for m in _FIELD.finditer(line)} for line in text.splitlines() if "=" in line
    ]


def _uid(user_field: str) -> tuple[str, int | None]:
    """``UserId=alice(1001)`` -> ("alice", 1001)."""
    m = re.match(r"^(.*?)\((\d+)\)$", user_field.strip())
    return (m.group(1), int(m.group(2))) if m else (user_field.strip(), None)


def _check_state(job: str, record: Mapping[str, str]) -> None:
    state = record.get("JobState", "UNKNOWN").split()[0]
    if state == "RUNNING":
        return
    if state in FINISHED or state == "COMPLETING":
        out = record.get("StdOut", "")
        raise SlurmJobNotRunning(
            f"Slurm job {job} is {state} (exit code {record.get('ExitCode', '?')}): no ranks are left to sample.",
            fix=f"Read what it left: `rankscope triage {out or 'THE_JOB_OUTPUT_FILE'}` (MCP: triage_logs); "
            "`squeue --me` lists your running jobs.",
        )
    reason = record.get("Reason", "")
    raise SlurmJobNotRunning(
        f"Slurm job {job} is {state}"
        + (f" (Reason={reason})" if reason and reason != "None" else "")
        + ": it has no running ranks now.",
        fix="Wait until `squeue -j "
        + job
        + "` shows it R (running), then collect again"
        + ("; `scontrol resume " + job + "` resumes it" if state == "SUSPENDED" else "")
        + ".",
    )


def _check_owner(job: str, record: Mapping[str, str], uid: int) -> None:
    name, owner = _uid(record.get("UserId", ""))
    if uid == 0 or owner is None or owner == uid:
        return
    raise SlurmJobNotYours(
        f"Slurm job {job} belongs to {name} (uid {owner}): `srun --overlap` joins only your own jobs.",
        fix=f"Run rankscope as {name} (or root), e.g. `sudo -u {name} rankscope stacks --via srun --job {job}`; "
        "`squeue --me` lists your own jobs.",
    )


def job_nodes(job: str, records: list[dict[str, str]], uid: int) -> list[str]:
    """The nodes of a running job of this user, from its ``scontrol show job -o`` records (the
    union over a heterogeneous job's components), in Slurm's order; raises the error that says
    why not (not running, another user's)."""
    if not records:
        raise SlurmJobNotFound(f"Slurm does not know job {job}.")
    running = [r for r in records if r.get("JobState", "").split()[:1] == ["RUNNING"]]
    for record in running or records[:1]:
        _check_state(job, record)
        _check_owner(job, record, uid)
    nodes: list[str] = []
    for record in running:
        for node in expand_hostlist(record.get("NodeList", "")) if record.get("NodeList") else []:
            if node not in nodes:
                nodes.append(node)
    if not nodes:
        raise SlurmJobNotRunning(
            f"Slurm job {job} is running but Slurm lists no nodes for it.",
            fix=f"Pass its nodes with --hosts (`scontrol show job {job}` shows NodeList).",
        )
    return nodes


def _failed(job: str, stderr: str) -> Exception:
    """The error for a failed ``scontrol show job``: an unknown job, or a controller out of reach."""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
    if "Invalid job id" in stderr:
        return SlurmJobNotFound(f"Slurm does not know job {job} ({last}).")
    return ExternalToolFailed(
        f"scontrol could not ask the Slurm controller about job {job}: {last}",
        fix="Check that the controller answers (`scontrol ping`) and that SLURM_CONF names this cluster's "
        "slurm.conf; or pass the job's nodes with --hosts and --via ssh.",
    )


_JOB_ID = re.compile(r"(?:slurm:)?(\d+(?:_\d+|\+\d+)?)(?:\.(?:\d+|batch|extern))?")
"""A Slurm job id as squeue prints it (``1234``, an array task ``1234_5``, a component ``1234+0``),
also as rankscope's job ids and sacct name a step of it (``slurm:1234.0``, ``1234.batch``)."""


def slurm_job_id(text: str) -> str:
    """The job id that ``srun --jobid`` and ``scontrol`` take, from what a user or an agent passes."""
    m = _JOB_ID.fullmatch(text.strip())
    if m is None:
        raise InvalidInput(
            f"job (--job) {text!r} is not a Slurm job id.",
            fix="Pass the numeric id `squeue --me` shows in its JOBID column, e.g. job=1234 (CLI: --job 1234).",
        )
    return m.group(1)


def slurm_job_nodes(job: str, timeout: float = SCONTROL_TIMEOUT) -> list[str]:
    """The nodes of running Slurm job ``job``, asked of the controller (``scontrol show job -o``)."""
    job = slurm_job_id(job)
    if shutil.which("scontrol") is None:
        raise InvalidInput(
            "--via srun asks Slurm for the job's nodes, and `scontrol` is not on PATH here.",
            fix="Run rankscope where Slurm's commands work (a login node or a node of the cluster: "
            "`squeue --me` must answer), or pass the nodes with --hosts and --via ssh.",
        )
    try:
        res = subproc.run(["scontrol", "show", "job", "-o", job], min(timeout, SCONTROL_TIMEOUT))
    except FileNotFoundError as exc:
        raise _failed(job, str(exc)) from exc
    if res.timed_out:
        raise _failed(job, "scontrol timed out (the controller did not answer)")
    if res.rc != 0:
        raise _failed(job, res.stderr)
    return job_nodes(job, parse_job_records(res.stdout), os.getuid())


SRUN_KEEPS = frozenset({"SLURM_CONF", "SLURM_CLUSTERS"})
"""The SLURM_* variables rankscope's srun keeps: which cluster to ask."""


def srun_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of rankscope's ``srun --jobid``: the caller's, without the SLURM_* variables
    of an allocation or a step it may run in (a batch script, a step on one node), which srun would
    read as its own (``--nodes``, CPUs and memory per task, "Only allocated 1 nodes asked for 2");
    without them srun asks the controller for the job, as from a login node."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k in SRUN_KEEPS}


def allocation_nodes(env: Mapping[str, str]) -> list[str]:
    """The allocation's nodes from its environment: SLURM_JOB_NODELIST and SLURM_NODELIST joined, as
    a step that ``srun --jobid`` started from outside the allocation has the step's nodes in the one
    and the job's in the other (a batch script and an ``salloc`` shell have the job's in both)."""
    nodes: list[str] = []
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        for node in expand_hostlist(env[name]) if env.get(name) else []:
            if node not in nodes:
                nodes.append(node)
    return nodes


SQUEUE_TIMEOUT = 3.0
"""Seconds the folder's Slurm job may take to find: a plain call must stay quick where Slurm is slow."""


def parse_workdirs(text: str) -> list[tuple[str, str]]:
    """``squeue -o '%i|%Z'`` output: (job id, its working directory) per line."""
    rows = [line.strip().split("|", 1) for line in text.splitlines() if "|" in line]
    return [(job.strip(), folder.strip()) for job, folder in rows if job.strip() and folder.strip()]


def started_in(rows: Sequence[tuple[str, str]], folder: str, home: str = "") -> str | None:
    """The one job started in ``folder`` (or in a folder above it, "/" and the home folder aside),
    as rankscope picks a job of this host by its folder; None when none or several are."""

    def norm(path: str) -> str:
        return path.rstrip("/") or "/"

    folder = norm(folder)
    exact = {job for job, cwd in rows if norm(cwd) == folder}
    if exact:
        return exact.pop() if len(exact) == 1 else None
    broad = {"/", norm(home)} if home else {"/"}
    above = {job for job, cwd in rows if norm(cwd) not in broad and folder.startswith(norm(cwd) + "/")}
    return above.pop() if len(above) == 1 else None


CONF_FILES = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/run/slurm/conf/slurm.conf")
"""Where a configured Slurm client finds its cluster, SLURM_CONF aside."""


def slurm_configured(env: Mapping[str, str]) -> bool:
    """Whether this machine's Slurm client names a cluster: a plain call asks squeue only then, as an
    installed but unconfigured Slurm may spend seconds on a DNS lookup before it fails."""
    if shutil.which("squeue") is None:
        return False
    return bool(env.get("SLURM_CONF")) or any(os.path.exists(path) for path in CONF_FILES)


def job_started_in(folder: str, env: Mapping[str, str] | None = None) -> str | None:
    """The user's running Slurm job started in ``folder`` (its WorkDir), asked of squeue; None when
    Slurm is not configured here, does not answer quickly, or no single job fits."""
    if not slurm_configured(os.environ if env is None else env):
        return None
    try:
        res = subproc.run(["squeue", "--me", "-h", "-t", "RUNNING", "-o", "%i|%Z"], SQUEUE_TIMEOUT)
    except FileNotFoundError:
        return None
    if res.timed_out or res.rc != 0:
        return None
    return started_in(parse_workdirs(res.stdout), folder, os.path.expanduser("~"))


def _here() -> str:
    try:
        return os.getcwd()
    except OSError:
        return ""


def slurm_target(
    target: StacksTarget,
    *,
    pid: int | None = None,
    job_id: str | None = None,
    ranks: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
    host: str | None = None,
    cwd: str | None = None,
) -> StacksTarget:
    """Where a ``rankscope stacks`` call looks on a Slurm cluster; ``--via srun``'s job as srun
    takes it (``slurm:1234.0``, rankscope's name for a step's ranks, is job 1234).

    A plain call (no hosts, via, pid, job or ranks) in or beside an allocation (SLURM_JOB_ID set):
    the allocation's nodes through ``srun --overlap`` when they are not just this host, since this
    host alone would show a part of the job or none of it (an ``salloc`` shell on a login node).
    Elsewhere (a login node), the one running job of the user that was started in the current
    folder, as on one host. Otherwise this host.

    srun's steps get this process's PATH: where ``rankscope`` is not on it, they run this
    rankscope (``python -m rankscope`` with this interpreter), on a cluster's shared filesystem."""
    env = os.environ if env is None else env
    if target.via == "srun" and target.job:
        return _own_rankscope(dataclasses.replace(target, job=slurm_job_id(target.job)), env)
    plain = not target.remote and pid is None and job_id is None and ranks is None
    if not plain or shutil.which("srun") is None:
        return _own_rankscope(target, env)
    if not env.get("SLURM_JOB_ID"):
        folder = cwd if cwd is not None else _here()
        job = job_started_in(folder, env) if folder else None
        return _own_rankscope(dataclasses.replace(target, via="srun", job=job), env) if job else target
    here = (host or socket.gethostname()).split(".")[0]
    try:
        nodes = allocation_nodes(env)
    except InvalidInput:
        return target
    if [n.split(".")[0] for n in nodes] == [here]:
        return target
    return _own_rankscope(dataclasses.replace(target, via="srun"), env)


def _own_rankscope(target: StacksTarget, env: Mapping[str, str]) -> StacksTarget:
    """``--via srun`` with the default command where ``rankscope`` is not on the PATH the steps get:
    this interpreter's ``-m rankscope``."""
    if target.via != "srun" or target.rankscope_cmd != "rankscope":
        return target
    if shutil.which("rankscope", path=env.get("PATH", os.defpath)) is not None:
        return target
    return dataclasses.replace(target, rankscope_cmd=shlex.join([sys.executable, "-m", "rankscope"]))


__all__ = [
    "allocation_nodes",
    "job_nodes",
    "job_started_in",
    "parse_job_records",
    "parse_workdirs",
    "slurm_configured",
    "slurm_job_id",
    "slurm_job_nodes",
    "slurm_target",
    "srun_env",
    "started_in",
]
