"""Cross-host collection: run ``rankscope stacks --local --json`` on every node at once, merge, judge.

rankscope brings no daemon: it uses the engines the cluster already has.
``ssh`` (BatchMode, the user's own config and keys), one ``srun --overlap``
step inside the job's Slurm allocation, or ``kubectl exec`` into the job's
pods. Every host runs concurrently with its own timeout; a host that cannot be
reached, lacks rankscope, times out or refuses the key becomes a ``RankError``
for that host with the fix, and the other hosts' ranks still arrive. The
per-host reports are merged into one ``Job`` and judged once by
``rankscope.analysis.hang.stacks.analyze``, so ranks nobody could see count as
missing. ``--via debug-server`` asks PyTorch's debug servers instead
(:mod:`rankscope.capabilities.recorder.debug_server`).

Command construction and output parsing are pure functions (tested against the
tools' documented syntax); only :func:`dump_stacks_remote` and its runners
start processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pydantic import ValidationError

from rankscope.analysis.code_origin import merge_roots
from rankscope.analysis.hostlist import expand_hostlist
from rankscope.analysis.ranges import rank_ranges, ranks_phrase
from rankscope.analysis.redact import Redactor
from rankscope.capabilities.recorder.debug_server import debug_server_look
from rankscope.errors import InvalidInput, NoJobsFound, NotADistributedJob
from rankscope.models.core import (
    Backend,
    Job,
    NextStep,
    RankError,
    RankProcess,
    RankStack,
    StacksReport,
)
from rankscope.models.flight import FlightReport
from rankscope.models.look import HostLook, JobChoice, SourceLine
from rankscope.models.startup import StartupFacts
from rankscope.options import DEFAULTS, LOCAL, DumpOptions, StacksTarget, option_flags
from rankscope.runtime import subproc

SKILL = "skill/multi-node.md#cross-host-collection"
MAX_OUTPUT = 64 << 20


# ---------------------------------------------------------------------------------------------
# Pure helpers: hostlists, pods, argv construction, outcome classification
# ---------------------------------------------------------------------------------------------


def pods_from_json(text: str) -> list[str]:
    """Names of the running pods in ``kubectl get pods -o json`` output, in name order."""
    import json

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(
            f"kubectl printed no JSON: {exc}", "Check `kubectl get pods -o json` by hand."
        ) from exc
    items = data.get("items", []) if isinstance(data, dict) else []
    names = []
    for item in items:
        if not isinstance(item, dict):
            continue
        name = item.get("metadata", {}).get("name")
        phase = item.get("status", {}).get("phase")
        if isinstance(name, str) and phase == "Running":
            names.append(name)
    return sorted(names)


def pod_selector(job: str) -> str:
    """A label selector for a job name: ``job-name=JOB`` (batch/v1 Jobs), or the selector as given."""
    return job if "=" in job else f"job-name={job}"


def kubectl_get_pods_argv(job: str, namespace: str | None) -> list[str]:
    """``kubectl get pods [-n NS] -l job-name=JOB -o json``."""
    argv = ["kubectl", "get", "pods"]
    if namespace:
        argv += ["-n", namespace]
    return [*argv, "-l", pod_selector(job), "-o", "json"]


@dataclass(frozen=True)
class Pick:
    """Which job a host inspects: its ``pid``, the job ``job_id``, or the one started in ``here``
    (the folder the call was made from; a host with one job takes it)."""

    pid: int | None = None
    job_id: str | None = None
    here: str | None = None

    def flags(self) -> list[str]:
        if self.pid is not None:
            return ["--pid", str(self.pid)]
        if self.job_id is not None:
            return ["--job", self.job_id]
        return ["--here", self.here] if self.here else []


def stacks_argv(
    options: DumpOptions,
    *,
    rankscope_cmd: str = "rankscope",
    pid: int | None = None,
    pick: Pick | None = None,
) -> list[str]:
    """The command each host runs: ``rankscope stacks --local --json [--pid PID | --job ID | --here DIR] [flags]``.

    Every option is forwarded (:func:`rankscope.options.option_flags`, one flag per field), the
    timeout a share of ours (:meth:`DumpOptions.for_remote_host`) so the host answers before the
    caller gives up on it.
    """
    argv = [*shlex.split(rankscope_cmd), "stacks", "--local", "--json"]
    argv += (pick or Pick(pid=pid)).flags()
    return argv + option_flags(options.for_remote_host())


FOUND = "rankscope-cmd: "
"""The line :func:`find_rankscope_argv` prints on stderr, naming the rankscope that answered."""


def own_command() -> list[str]:
    """How this rankscope runs: its own absolute path, or this interpreter with ``-m rankscope``
    (on a cluster the filesystem is shared, so the same path usually works on every node)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "rankscope" and os.path.isfile(argv0):
        return [os.path.abspath(argv0)]
    return [sys.executable, "-m", "rankscope"]


def find_rankscope_argv(args: Sequence[str], own: Sequence[str]) -> list[str]:
    """``sh -c SCRIPT`` that runs ``rankscope ARGS`` on a host with the first rankscope it finds:
    on the PATH, at ``own`` (the collecting rankscope's path), else the interpreter of a rank of
    the job there (a process with RANK or LOCAL_RANK set): its ``argv[0]`` when absolute (a
    virtual environment's python, which /proc/PID/exe resolves past), then ``/proc/PID/exe``,
    with ``-m rankscope``. It names the one that answered on stderr (:data:`FOUND`); none: 127."""
    own_q = shlex.join(own)
    script = (
        f'if command -v rankscope >/dev/null 2>&1; then echo "{FOUND}rankscope" >&2; exec rankscope "$@"; fi; '
        f'if [ -x {shlex.quote(own[0])} ]; then echo "{FOUND}"{shlex.quote(own_q)} >&2; exec {own_q} "$@"; fi; '
        'tried=""; for p in /proc/[0-9]*; do '
        "tr '\\0' '\\n' 2>/dev/null < $p/environ | grep -q -e '^RANK=' -e '^LOCAL_RANK=' || continue; "
        "a=$(tr '\\0' '\\n' 2>/dev/null < $p/cmdline | head -n 1); x=$(readlink $p/exe 2>/dev/null); "
        'for c in "$a" "$x"; do '
        'case "$c" in /*) ;; *) continue;; esac; case " $tried " in *" $c "*) continue;; esac; tried="$tried $c"; '
        '"$c" -c "import rankscope" >/dev/null 2>&1 || continue; '
        f'echo "{FOUND}$c -m rankscope" >&2; exec "$c" -m rankscope "$@"; done; done; '
        "echo \"rankscope: command not found (not on PATH, not at the collecting host's path, "
        "not importable by the job's python)\" >&2; exit 127"
    )
    return ["sh", "-c", script, "rankscope", *args]


def ssh_argv(
    host: str, remote: Sequence[str], *, timeout: float, ssh_options: Sequence[str] = ()
) -> list[str]:
    """``ssh -o BatchMode=yes -o ConnectTimeout=N [opts] HOST -- 'quoted command'``.

    BatchMode: never prompt for a password or a host key (a prompt would hang the
    capture); the user's ~/.ssh/config, agent and keys apply as usual. ssh joins
    its arguments into one string for the remote shell, hence the quoting.
    """
    connect = max(1, min(int(timeout), 10))
    return [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect}",
        *ssh_options,
        host,
        "--",
        shlex.join(remote),
    ]


def srun_argv(job: str, hosts: Sequence[str], remote: Sequence[str]) -> list[str]:
    """One job step on every node of the allocation: one task per node, output labelled by task.

    ``--overlap`` shares the CPUs the training step already holds (Slurm >= 20.11),
    ``--label`` prefixes each output line with the task id, ``--kill-on-bad-exit=0``
    keeps the other tasks going when one node fails.
    """
    n = len(hosts)
    return [
        "srun",
        "--overlap",
        f"--jobid={job}",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(hosts)}",
        "--label",
        "--kill-on-bad-exit=0",
        *remote,
    ]


def kubectl_exec_argv(
    pod: str, remote: Sequence[str], namespace: str | None = None, container: str | None = None
) -> list[str]:
    """``kubectl exec [-n NS] POD [-c C] -- rankscope stacks --local --json``."""
    argv = ["kubectl", "exec"]
    if namespace:
        argv += ["-n", namespace]
    argv.append(pod)
    if container:
        argv += ["-c", container]
    return [*argv, "--", *remote]


def split_labelled(text: str) -> dict[int, str]:
    """Undo ``srun --label``: ``' 0: line'`` -> {0: 'line\\n...'}; unlabelled lines are dropped."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\d+): ?(.*)$", line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return {k: "\n".join(v) for k, v in out.items()}


_FIX_UNREACHABLE = (
    "Check that the host name resolves and the node is up (`ssh -o BatchMode=yes {host} true`); "
    "or collect this node with --via srun / kubectl, or run `rankscope stacks` on it directly."
)
_FIX_AUTH = (
    "rankscope runs ssh with BatchMode=yes and never prompts: load your key into ssh-agent or configure it "
    "in ~/.ssh/config for {host} (`ssh -o BatchMode=yes {host} true` must work without a prompt)."
)
_FIX_NOT_INSTALLED = (
    "Install rankscope on {host} into the training job's environment (`pip install rankscope`), or pass "
    "--rankscope-cmd with its full path (e.g. /venv/bin/rankscope or 'python -m rankscope')."
)
_FIX_TIMEOUT = (
    "{host} did not answer within {timeout:g}s: retry with a longer --timeout; a rank stuck in the kernel "
    "(state D) cannot be sampled, try --nonblocking."
)


def classify_failure(
    host: str, via: str, rc: int | None, stderr: str, *, timed_out: bool, timeout: float
) -> RankError:
    """Turn one host's failed run into a RankError with the fix (pure: exit code and stderr only)."""
    err = stderr.strip()
    last = err.splitlines()[-1] if err else ""
    if timed_out:
        return RankError(
            host=host,
            kind="timeout",
            message=f"{host}: no answer within {timeout:g}s",
            fix=_FIX_TIMEOUT.format(host=host, timeout=timeout),
        )
    if (
        re.search(r"Permission denied \((publickey|password|keyboard-interactive|gssapi)", err)
        or "Host key verification failed" in err
    ):
        return RankError(
            host=host,
            kind="auth_failed",
            message=f"{host}: {last or 'authentication failed'}",
            fix=_FIX_AUTH.format(host=host),
        )
    not_found = re.search(
        r"command not found|No such file or directory|executable file not found|not found in \$PATH|"
        r"No module named rankscope|can't open file",
        err,
    )
    if rc in (126, 127) or (not_found and "rankscope" in err):
        return RankError(
            host=host,
            kind="not_installed",
            message=f"{host}: rankscope not found ({last or f'exit {rc}'})",
            fix=_FIX_NOT_INSTALLED.format(host=host),
        )
    if via == "ssh" and rc == 255:
        return RankError(
            host=host,
            kind="unreachable",
            message=f"{host}: {last or 'ssh failed (exit 255)'}",
            fix=_FIX_UNREACHABLE.format(host=host),
        )
    if via == "kubectl" and re.search(
        r"NotFound|Unable to connect|connection refused|container not found", err
    ):
        return RankError(
            host=host,
            kind="unreachable",
            message=f"{host}: {last}",
            fix="Check the pod name and namespace (`kubectl get pods -n NS`) and your kube context.",
        )
    if via == "srun" and (m := re.search(r"Unable to confirm allocation for job \S+: (.*)", err)):
        return RankError(
            host=host,
            kind="unreachable",
            message=f"{host}: srun could not join the job: {m.group(1).strip()}",
            fix="Check the job with `squeue --me` (running, and yours); pass its id with --job.",
        )
    fix_m = re.search(r"^Fix: (.*)$", err, re.MULTILINE)
    msg_line = next((ln for ln in err.splitlines() if "error:" in ln), last)
    return RankError(
        host=host,
        kind="failed",
        message=f"{host}: rankscope exited {rc}: {msg_line or 'no output'}",
        fix=fix_m.group(1) if fix_m else f"Run the same command on {host} by hand to see the full error.",
    )


def parse_report(host: str, stdout: str) -> StacksReport | RankError:
    """A host's ``--json`` output as a report, or the error that says why it is not one."""
    text = stdout.strip()
    start = text.find("{")
    if start < 0:
        return _no_json(host)
    try:
        return StacksReport.model_validate_json(text[start:])
    except ValidationError as exc:
        return _unreadable(host, str(exc).splitlines()[0] if str(exc) else "invalid report")


def parse_look(host: str, stdout: str) -> HostLook | RankError:
    """A host's ``--local --json`` output as its evidence, or the error that says why it is not.
    A rankscope that still answers with a whole report (a verdict) is read as its evidence."""
    text = stdout.strip()
    start = text.find("{")
    try:
        raw = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        raw = None
    if isinstance(raw, dict) and "verdict" in raw:
        rep = parse_report(host, stdout)
        if isinstance(rep, RankError):
            return rep
        return HostLook(host=host, job=rep.job, stacks=rep.stacks, errors=rep.errors, progress=rep.progress)
    if start < 0:
        return _no_json(host)
    if not isinstance(raw, dict):
        return _unreadable(host, "not JSON")
    try:
        return HostLook.model_validate(raw)
    except ValidationError as exc:
        return _unreadable(host, str(exc).splitlines()[0] if str(exc) else "invalid evidence")


def _no_json(host: str) -> RankError:
    return RankError(
        host=host,
        kind="failed",
        message=f"{host}: rankscope printed no JSON report",
        fix="Check that the rankscope on the host is the same version (`rankscope --version`).",
    )


def _unreadable(host: str, why: str) -> RankError:
    return RankError(
        host=host,
        kind="failed",
        message=f"{host}: unreadable report ({why})",
        fix="Install the same rankscope version on every host.",
    )


def jobs_on_hosts(looks: Mapping[str, HostLook]) -> list[str]:
    """Every job the hosts saw (their one job or their choices), once each: id, world size, its
    ranks host by host, launchers and the folder it was started in."""
    seen: dict[str, list[tuple[str, JobChoice]]] = {}
    for host, look in looks.items():
        choices = list(look.choices)
        if look.job is not None:
            job = look.job
            choices.append(
                JobChoice(
                    job_id=job.job_id,
                    world_size=job.world_size,
                    ranks=sorted(r.rank for r in job.ranks if r.rank is not None),
                )
            )
        for c in choices:
            seen.setdefault(c.job_id, []).append((host, c))
    lines = []
    for job_id, where in seen.items():
        world = next((c.world_size for _, c in where if c.world_size), None)
        ranks = ", ".join(f"{rank_ranges(c.ranks) or '?'} on {h}" for h, c in where)
        cwd = next((c.cwd for _, c in where if c.cwd), None)
        lines.append(
            f"{job_id} (world size {world or '?'}, ranks {ranks}"
            + (f", started in {cwd}" if cwd else "")
            + ")"
        )
    return lines


def one_job(looks: Mapping[str, HostLook]) -> str | None:
    """The job every host should inspect when the hosts picked differently or some could not pick:
    the one job the hosts found started in the caller's folder, else the one job any host picked
    alone when every host that could not pick runs it too; None when that says nothing."""
    picked = {h: lk.job.job_id for h, lk in looks.items() if lk.job is not None}
    unsure = [lk for lk in looks.values() if lk.job is None and lk.choices]
    if len(set(picked.values())) <= 1 and not unsure:
        return None
    by_folder = {lk.job.job_id for lk in looks.values() if lk.job is not None and lk.chosen_by == "folder"}
    if len(by_folder) == 1:
        return by_folder.pop()
    ids = set(picked.values())
    if len(ids) == 1:
        only = next(iter(ids))
        if all(any(c.job_id == only for c in lk.choices) for lk in unsure):
            return only
    return None


def merge_reports(
    reports: Mapping[str, StacksReport | HostLook], host_errors: Sequence[RankError], hosts: Sequence[str]
) -> tuple[Job, list[RankStack], list[RankError], list[str]]:
    """One job from per-host reports: ranks from all hosts, named by the host alias that answered."""
    ranks: list[RankProcess] = []
    stacks: list[RankStack] = []
    errors: list[RankError] = list(host_errors)
    notes: list[str] = []
    seen: dict[int, str] = {}
    world = None
    first: Job | None = None
    exited: set[int] = set()
    for host in hosts:
        rep = reports.get(host)
        if rep is None or rep.job is None:
            continue
        job = rep.job
        first = first or job
        if job.world_size is not None:
            if world is not None and world != job.world_size:
                notes.append(f"{host} reports world size {job.world_size}, others {world}: kept the larger")
            world = max(world or 0, job.world_size)
        exited |= set(job.exited_ranks)
        for r in job.ranks:
            if r.rank is not None and r.rank in seen:
                notes.append(
                    f"rank {r.rank} reported by both {seen[r.rank]} and {host}: kept {seen[r.rank]}'s"
                )
                continue
            if r.rank is not None:
                seen[r.rank] = host
            alias = f"{host} answered as {r.host}"
            if r.host != host and alias not in notes:
                notes.append(alias)
            ranks.append(r.model_copy(update={"host": host}))
        for s in rep.stacks:
            if s.rank is not None and seen.get(s.rank) not in (None, host):
                continue
            err = s.error.model_copy(update={"host": host}) if s.error is not None else None
            stacks.append(s.model_copy(update={"host": host, "error": err}))
        errors.extend(e.model_copy(update={"host": host}) for e in rep.errors)
        notes.extend(f"{host}: {n}" for n in job.notes)
    answered = [h for h in hosts if h in reports]
    job = Job(
        job_id=first.job_id if first else "unknown",
        launcher=first.launcher if first else "unknown",
        world_size=world,
        master_addr=first.master_addr if first else None,
        master_port=first.master_port if first else None,
        backend=_one_backend(reports.values()),
        recorder=first.recorder if first else None,
        hosts=list(hosts),
        ranks=sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.host, r.pid)),
        exited_ranks=sorted(exited),
        notes=[*notes, f"answered: {', '.join(answered) or 'none'} of {len(hosts)} host(s)"],
    )
    return job, stacks, errors, notes


def _one_backend(reports: Iterable[StacksReport | HostLook]) -> Backend | None:
    """The hosts' backend: theirs when they agree, ``mixed`` when they do not (the store's note and
    the NCCL rules need it on the collecting host too)."""
    seen = {r.job.backend for r in reports if r.job is not None and r.job.backend is not None}
    return seen.pop() if len(seen) == 1 else ("mixed" if seen else None)


def account_for_unseen(report: StacksReport, failed: Sequence[RankError]) -> StacksReport:
    """Say in the verdict which hosts could not be seen, and what to fix first."""
    if not failed:
        return report
    hosts = ", ".join(sorted({e.host or "?" for e in failed}))
    missing = report.job.missing_ranks
    line = f"could not collect from {hosts}" + (
        f"; {ranks_phrase(missing)} not seen (may run there)" if missing else ""
    )
    steps = [
        NextStep(
            action=f"Fix access to {hosts} (see errors[].fix) and collect again: the verdict covers only the hosts that answered.",
            tool="dump_stacks",
            skill_section=SKILL,
        ),
        *report.verdict.next_steps,
    ]
    verdict = report.verdict.model_copy(
        update={"evidence": [line, *report.verdict.evidence], "next_steps": steps}
    )
    return report.model_copy(update={"verdict": verdict})


# ---------------------------------------------------------------------------------------------
# The shell: run, time out, reap
# ---------------------------------------------------------------------------------------------


def _run(argv: list[str], timeout: float, env: Mapping[str, str] | None = None) -> subproc.Completed:
    if env is None and argv[:1] == ["srun"]:
        from rankscope.capabilities.slurm import srun_env

        env = srun_env()  # never the caller's allocation: srun would take it for its own
    try:
        res = subproc.run(argv, timeout, env)
    except FileNotFoundError as exc:
        return subproc.Completed(127, "", f"{argv[0]}: command not found ({exc})", False, 0.0)
    return dataclasses.replace(res, stdout=res.stdout[:MAX_OUTPUT], stderr=res.stderr[-20000:])


def _need(binary: str, via: str) -> None:
    if shutil.which(binary) is None:
        raise InvalidInput(
            f"--via {via} needs `{binary}` on this machine, and it is not on PATH.",
            {
                "ssh": "Install an OpenSSH client, or use --via srun inside a Slurm allocation.",
                "srun": "Run rankscope where Slurm's commands work (a login node or a node of the cluster: "
                "`squeue --me` must answer), or use --hosts with --via ssh.",
                "kubectl": "Install kubectl and select the cluster's context, or use --via ssh.",
            }.get(via, "Install it."),
        )


def hosts_from_environment(env: Mapping[str, str] | None = None) -> list[str]:
    """Hosts of the current Slurm job: SLURM_JOB_NODELIST (or SLURM_NODELIST), else `scontrol show hostnames`."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        try:
            return expand_hostlist(nodelist)
        except InvalidInput:
            if shutil.which("scontrol"):
                res = _run(["scontrol", "show", "hostnames", nodelist], 10.0)
                if res.rc == 0:
                    return [h for h in res.stdout.split() if h]
            raise
    raise InvalidInput(
        "no hosts given and no Slurm allocation in the environment (SLURM_JOB_NODELIST is unset).",
        "Pass --hosts node1,node2 (a Slurm hostlist like node[01-04] works), or --job for --via srun/kubectl.",
    )


def pods_of_job(job: str, namespace: str | None, timeout: float) -> list[str]:
    """Running pods of a Kubernetes job, from `kubectl get pods -l job-name=JOB -o json`."""
    _need("kubectl", "kubectl")
    res = _run(kubectl_get_pods_argv(job, namespace), timeout)
    if res.timed_out or res.rc != 0:
        raise InvalidInput(
            f"kubectl could not list the pods of {job}: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else 'timeout'}",
            "Check the job name, --namespace and your kube context (`kubectl get pods -n NS -l job-name=JOB`).",
        )
    pods = pods_from_json(res.stdout)
    if not pods:
        raise InvalidInput(
            f"no running pods with label {pod_selector(job)}",
            "Pass --hosts POD1,POD2 explicitly, or a label selector with --job key=value.",
        )
    return pods


@dataclass
class _FanOut:
    """How one multi-host call asks its hosts: the engine (ssh, srun, kubectl, local), the command,
    and, where rankscope is not given (``--rankscope-cmd``), over ssh the search for one on each host
    (:func:`find_rankscope_argv`); ``found`` keeps the rankscope each host answered with."""

    target: StacksTarget
    options: DumpOptions
    ssh_options: Sequence[str]
    redactor: Redactor = dataclasses.field(default_factory=Redactor)
    found: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def timeout(self) -> float:
        return self.options.timeout + self.options.window

    def remote(self, pick: Pick) -> list[str]:
        argv = stacks_argv(self.options, rankscope_cmd=self.target.rankscope_cmd, pick=pick)
        if self.target.rankscope_cmd == "rankscope" and self.target.via == "ssh":
            return find_rankscope_argv(argv[1:], own_command())
        return argv

    def ask(self, hosts: Sequence[str], pick_for: Callable[[str], Pick]) -> dict[str, HostLook | RankError]:
        """Each host's evidence (or the error that says why there is none), all hosts at once."""
        via = self.target.via
        if not hosts:
            return {}
        if via == "srun":
            slurm_job = self.target.job or os.environ.get("SLURM_JOB_ID")
            if not slurm_job:
                raise InvalidInput(
                    "--via srun needs the Slurm job id", "Pass --job JOBID (see `squeue --me`)."
                )
            remote = self.remote(pick_for(hosts[0]))
            return _srun_all(slurm_job, list(hosts), remote, self.timeout + 5.0, self.redactor)
        with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
            futures = {h: pool.submit(self._one_host, h, pick_for(h)) for h in hosts}
            return {h: f.result() for h, f in futures.items()}

    def _one_host(self, host: str, pick: Pick) -> HostLook | RankError:
        via, remote = self.target.via, self.remote(pick)
        env: Mapping[str, str] | None = None
        if via == "ssh":
            argv = ssh_argv(host, remote, timeout=self.options.timeout, ssh_options=self.ssh_options)
        elif via == "kubectl":
            argv = kubectl_exec_argv(host, remote, self.target.namespace)
        else:
            argv, env = remote, {**os.environ, "RANKSCOPE_HOSTNAME": host}
        res = _run(argv, self.timeout, env)
        stderr = self.redactor.text(res.stderr)
        found = re.search(rf"^{FOUND}(.+)$", stderr, re.MULTILINE)
        if found and found.group(1) != "rankscope":
            self.found[host] = found.group(1)
        if res.timed_out or res.rc != 0:
            return classify_failure(host, via, res.rc, stderr, timed_out=res.timed_out, timeout=self.timeout)
        return parse_look(host, res.stdout)


def host_looks(
    target: StacksTarget, options: DumpOptions, hosts: Sequence[str], pick_for: Callable[[str], Pick]
) -> dict[str, HostLook | RankError]:
    """Each host's evidence, unjudged (or the error that says why there is none), all hosts at once:
    what a watch keeps of a stall, one look per host, for triage to judge later as a live call would."""
    if target.via in ("ssh", "kubectl", "srun"):
        _need(target.via, target.via)
    return _FanOut(target, options, ()).ask(hosts, pick_for)


def _srun_all(
    job: str, hosts: list[str], remote: list[str], timeout: float, redactor: Redactor
) -> dict[str, HostLook | RankError]:
    """One srun step for all nodes; each task's labelled output is its node's report."""
    res = _run(srun_argv(job, hosts, remote), timeout)
    out: dict[str, HostLook | RankError] = {}
    by_task = split_labelled(res.stdout)
    looks = [parse_look(f"task {t}", text) for t, text in sorted(by_task.items())]
    for look in looks:
        if isinstance(look, HostLook):
            # the report names its node; map it back onto the hostlist entry
            names = {look.host} | (
                {r.host for r in look.job.ranks} | set(look.job.hosts) if look.job else set()
            )
            host = next((h for h in hosts if h in names or any(n.split(".")[0] == h for n in names)), None)
            if host is None:
                host = next((h for h in hosts if h not in out), f"node{len(out)}")
            out[host] = look
    stderr = redactor.text(res.stderr)
    for host in hosts:
        if host not in out:
            out[host] = classify_failure(
                host, "srun", res.rc if res.rc != 0 else 1, stderr, timed_out=res.timed_out, timeout=timeout
            )
    return out


def _slurm_hosts(job: str | None, env: Mapping[str, str] | None = None) -> list[str]:
    """The nodes of Slurm job ``job`` (default: the allocation's, SLURM_JOB_ID): from the
    allocation's environment inside it, else asked of the controller, which also says when the job
    is not running or not the user's (a login node has no allocation in its environment)."""
    env = os.environ if env is None else env
    job = job or env.get("SLURM_JOB_ID")
    if not job:
        raise InvalidInput(
            "via srun (--via srun) needs the Slurm job: no job (--job) given and no Slurm allocation in the "
            "environment (SLURM_JOB_ID is unset).",
            "Pass job=JOBID (CLI: --job JOBID; `squeue --me` lists your jobs), or hosts with via ssh.",
        )
    from rankscope.capabilities.slurm import slurm_job_id, slurm_job_nodes

    job = slurm_job_id(job)
    if job == env.get("SLURM_JOB_ID") and (nodes := _allocation_nodes(env)):
        return nodes
    _need("srun", "srun")
    return slurm_job_nodes(job)


def _allocation_nodes(env: Mapping[str, str]) -> list[str]:
    """The allocation's nodes from its environment; a hostlist only Slurm can expand is asked of it."""
    from rankscope.capabilities.slurm import allocation_nodes

    try:
        return allocation_nodes(env)
    except InvalidInput:
        return hosts_from_environment(env)


def _host_list(target: StacksTarget, timeout: float) -> list[str]:
    """The hosts to collect from: given (parsed by the target), the job's pods, or the allocation's."""
    if target.hosts:
        host_list = list(target.hosts)
    elif target.via == "kubectl":
        if not target.job:
            raise InvalidInput(
                "--via kubectl needs --hosts PODS or --job JOBNAME",
                "Pass --job with the Kubernetes job name.",
            )
        host_list = pods_of_job(target.job, target.namespace, timeout)
    elif target.via == "srun":
        host_list = _slurm_hosts(target.job)
    else:
        host_list = hosts_from_environment()
    if not host_list:
        raise InvalidInput("no hosts to collect from", "Pass --hosts node1,node2.")
    return host_list


def dump_stacks_remote(
    target: StacksTarget = LOCAL,
    options: DumpOptions = DEFAULTS,
    *,
    pid: int | None = None,
    pids: Mapping[str, int] | None = None,
    ssh_options: Sequence[str] = (),
    job_id: str | None = None,
) -> StacksReport:
    """Capture the stacks of a job's ranks on every host of ``target`` at once and judge them together.

    ``target.hosts``: node names (Slurm hostlists already expanded by the target); without them,
    the Slurm allocation's nodes (SLURM_JOB_NODELIST) or, with ``via="kubectl"``, the running pods
    of ``target.job``. Each host runs ``rankscope stacks --local --json`` with every option of
    ``options`` (:func:`stacks_argv`) and returns its evidence; the hosts' evidence is merged
    and judged once (:func:`judge_looks`). Which job: ``pid`` on every host, ``pids`` a host's own
    (the job it finds there is then asked of the other hosts by id), ``job_id`` (with ssh,
    ``target.job`` too) on every host, else the job started in the current folder, else each
    host's only job; several jobs and no choice: one error that lists them, for all hosts.
    """
    if target.via == "debug-server":
        return judge_debug_server(debug_server_look(target, options), options)
    host_list = _host_list(target, options.timeout)
    if target.via in ("ssh", "kubectl", "srun"):
        _need(target.via, target.via)
    started = time.monotonic()
    fan = _FanOut(target, options, ssh_options)
    chosen = job_id or (target.job if target.via in ("ssh", "local") else None)
    # srun starts its steps in the caller's folder already; a pod has folders of its own
    here = _cwd() if target.via in ("ssh", "local") else None

    def pick_for(host: str) -> Pick:
        own = (pids or {}).get(host, pid)
        if own is not None:
            return Pick(pid=own)
        return Pick(job_id=chosen) if chosen else Pick(here=here)

    first = [h for h in host_list if h in (pids or {})] if pids and not chosen and pid is None else []
    if first and len(first) < len(host_list):
        # a launcher's pid on some hosts: its job, by id, on the others
        results = fan.ask(first, pick_for)
        ids = {r.job.job_id for r in results.values() if isinstance(r, HostLook) and r.job is not None}
        chosen = ids.pop() if len(ids) == 1 else None
        results.update(fan.ask([h for h in host_list if h not in results], pick_for))
    else:
        results = fan.ask(host_list, pick_for)
    if not chosen and pid is None and not pids:
        results = _one_job_everywhere(fan, results, host_list)
    note = f"collected via {target.via} in {time.monotonic() - started:.1f}s"
    found = {h: fan.found[h] for h in host_list if h in fan.found}
    return judge_looks(results, host_list, [*_found_notes(found), note], options)


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


def _one_job_everywhere(
    fan: _FanOut, results: dict[str, HostLook | RankError], host_list: list[str]
) -> dict[str, HostLook | RankError]:
    """The hosts picked their job themselves: where they disagree, or some run several, ask again
    by the id of the job :func:`one_job` settles on; when none, list every job once for all hosts."""
    looks = {h: r for h, r in results.items() if isinstance(r, HostLook) and r.absent is None}
    agreed = {lk.job.job_id for lk in looks.values() if lk.job is not None}
    if len(agreed) <= 1 and all(lk.job is not None for lk in looks.values()):
        return results
    if all(lk.job is not None and lk.startup and lk.chosen_by == "folder" for lk in looks.values()):
        return results  # each host's job in start-up, started in the caller's folder: where ids differ, the verdict says why
    job_id = one_job(looks)
    if job_id is None:
        lines = jobs_on_hosts(looks)
        raise NotADistributedJob(
            f"{len(lines)} distributed jobs run on {', '.join(looks)}: {'; '.join(lines)}.",
            fix="Pass --job JOB_ID (MCP: job_id=) to inspect one on every host, or --pid HOST:PID with its "
            "launcher, or run rankscope from the folder the job was started in.",
        )
    again = [h for h, lk in looks.items() if lk.job is None or lk.job.job_id != job_id]
    return {**results, **fan.ask(again, lambda h: Pick(job_id=job_id))}


def _found_notes(found: Mapping[str, str]) -> list[str]:
    """Which rankscope answered on the hosts where it was not on the PATH."""
    by_cmd: dict[str, list[str]] = {}
    for host, cmd in found.items():
        by_cmd.setdefault(cmd, []).append(host)
    return [f"rankscope not on the PATH of {', '.join(h)}: ran {cmd}" for cmd, h in by_cmd.items()]


def _source(stacks: list[RankStack], looks: Mapping[str, HostLook]) -> dict[tuple[str, int], str]:
    """The source lines the merged ranks' frames need: read here where the files are (a shared
    path), and each host's own lines, which win (they are the files its ranks run)."""
    from rankscope.capabilities.stacks import source_lines

    source = source_lines(stacks)
    for look in looks.values():
        source.update({(s.file, s.line): s.text for s in look.source})
    return source


def _flight(looks: Mapping[str, HostLook], world: int | None) -> tuple[FlightReport | None, list[str]]:
    """The recorder evidence across hosts: the dumps every host read, read again here and analysed
    together where their paths are on this host too (a shared folder, as TORCH_FR_DUMP_TEMP_FILE
    usually is); else the host's analysis that covers most ranks (said when several hosts had one)."""
    from rankscope.analysis.recorder.flight import analyze as analyze_flight
    from rankscope.capabilities.recorder.flight import read_dumps

    have = sorted(
        ((h, lk.flight) for h, lk in looks.items() if lk.flight is not None), key=lambda x: -len(x[1].ranks)
    )
    if not have:
        return None, []
    host, best = have[0]
    if len(have) == 1:
        return best, []
    paths = sorted({d.path for _, f in have for d in f.dumps if os.path.isfile(d.path)})
    dumps, errors = read_dumps(paths) if paths else ([], [])
    if dumps:
        merged = analyze_flight(dumps, errors, world_size=world)
        if len(merged.ranks) > len(best.ranks):
            return merged, [f"flight recorder: the dumps of {len(have)} hosts analysed together"]
    return best, [f"flight recorder: the dumps read on {host} analysed ({len(have)} hosts had some)"]


def judge_debug_server(look: HostLook, options: DumpOptions = DEFAULTS) -> StacksReport:
    """The debug servers' look judged as any capture is (the same verdict and follow-ups as the
    local and multi-host calls), with the recorder's own verdict among the evidence when the
    verdict does not already name it."""
    from rankscope.capabilities.judge import judge_look

    report = judge_look(look, options)
    flight = look.flight
    if flight is not None and "flight recorder" not in report.verdict.summary:
        evidence = [
            *report.verdict.evidence,
            f"flight recorder ({flight.verdict.kind}): {flight.verdict.summary}",
        ]
        report = report.model_copy(
            update={"verdict": report.verdict.model_copy(update={"evidence": evidence})}
        )
    return report


def judge_looks(
    results: Mapping[str, HostLook | StacksReport | RankError],
    host_list: list[str],
    notes: Sequence[str],
    options: DumpOptions = DEFAULTS,
) -> StacksReport:
    """One verdict from every host's evidence (and each failed host's error): the looks merged into
    one, judged as one host's capture is (:func:`~rankscope.capabilities.judge.judge_look`), with
    the source lines, the recorder, RAS, the progress window, the follow-ups and the workers."""
    from rankscope.analysis.hang.progress import merge_progress
    from rankscope.capabilities.judge import judge_look

    looks = {
        h: (
            r
            if isinstance(r, HostLook)
            else HostLook(host=h, job=r.job, stacks=r.stacks, errors=r.errors, progress=r.progress)
        )
        for h, r in results.items()
        if not isinstance(r, RankError)
    }
    failed = [r for r in results.values() if isinstance(r, RankError)]
    absent = [h for h in host_list if h in looks and looks[h].absent is not None]
    if not failed and absent and len(absent) == len(looks):
        raise NoJobsFound(
            f"No rank of a distributed PyTorch job on {', '.join(absent)}: {looks[absent[0]].absent}"
        )
    merged_job, stacks, errors, _ = merge_reports(looks, failed, host_list)
    flight, said = _flight(looks, merged_job.world_size)
    if absent:
        said.append(f"no rank of the job on {', '.join(absent)}")
    merged_job = merged_job.model_copy(update={"notes": [*merged_job.notes, *said, *notes]})
    progress = merge_progress(
        [lk.progress for lk in looks.values() if lk.progress is not None], merged_job.backend
    )
    startup = _startup_facts(looks)
    source = _source(stacks, looks)
    merged = HostLook(
        host=",".join(looks),
        job=merged_job,
        stacks=stacks,
        errors=errors,
        progress=progress,
        flight=flight,
        ras=next((lk.ras for lk in looks.values() if lk.ras is not None), None),
        source=[SourceLine(file=f, line=n, text=t) for (f, n), t in sorted(source.items())],
        workers=[w for lk in looks.values() for w in lk.workers],
        worker_servers=any(lk.worker_servers for lk in looks.values()),
        code_roots=merge_roots(lk.code_roots for lk in looks.values()),
        startup=startup,
    )
    return account_for_unseen(judge_look(merged, options, remote=True), failed)


def _startup_facts(looks: Mapping[str, HostLook]) -> list[StartupFacts]:
    """Every host's start-up facts, named by the host alias that answered, when some host's job is
    in start-up (none otherwise: a running job is judged by its stacks)."""
    if not any(lk.job is not None and lk.startup for lk in looks.values()):
        return []
    out = []
    for host, look in looks.items():
        for facts in look.startup or [StartupFacts(host=host)]:
            out.append(
                facts.model_copy(
                    update={
                        "host": host,
                        "launchers": [lf.model_copy(update={"host": host}) for lf in facts.launchers],
                        "listeners": [lt.model_copy(update={"host": host}) for lt in facts.listeners],
                    }
                )
            )
    return out


__all__ = [
    "classify_failure",
    "dump_stacks_remote",
    "expand_hostlist",
    "host_looks",
    "hosts_from_environment",
    "judge_debug_server",
    "judge_looks",
    "kubectl_exec_argv",
    "kubectl_get_pods_argv",
    "merge_reports",
    "parse_look",
    "parse_report",
    "pods_from_json",
    "split_labelled",
    "srun_argv",
    "ssh_argv",
    "stacks_argv",
]
