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
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from pydantic import ValidationError

from rankscope.analysis.hostlist import expand_hostlist
from rankscope.analysis.ranges import ranks_phrase
from rankscope.analysis.redact import Redactor
from rankscope.capabilities.recorder.debug_server import dump_stacks_debug_server
from rankscope.errors import InvalidInput
from rankscope.models.core import (
    Job,
    NextStep,
    RankError,
    RankProcess,
    RankStack,
    StacksReport,
)
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


def stacks_argv(
    options: DumpOptions, *, rankscope_cmd: str = "rankscope", pid: int | None = None
) -> list[str]:
    """The command each host runs: ``rankscope stacks --local --json [--pid PID] [flags]``.

    Every option is forwarded (:func:`rankscope.options.option_flags`, one flag per field), the
    timeout a share of ours (:meth:`DumpOptions.for_remote_host`) so the host answers before the
    caller gives up on it.
    """
    argv = [*shlex.split(rankscope_cmd), "stacks", "--local", "--json"]
    if pid is not None:
        argv += ["--pid", str(pid)]
    return argv + option_flags(options.for_remote_host())


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
        return RankError(
            host=host,
            kind="failed",
            message=f"{host}: rankscope printed no JSON report",
            fix="Check that the rankscope on the host is the same version (`rankscope --version`).",
        )
    try:
        return StacksReport.model_validate_json(text[start:])
    except ValidationError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid report"
        return RankError(
            host=host,
            kind="failed",
            message=f"{host}: unreadable report ({first})",
            fix="Install the same rankscope version on every host.",
        )


def merge_reports(
    reports: Mapping[str, StacksReport], host_errors: Sequence[RankError], hosts: Sequence[str]
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
        if rep is None:
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
        hosts=list(hosts),
        ranks=sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.host, r.pid)),
        exited_ranks=sorted(exited),
        notes=[*notes, f"answered: {', '.join(answered) or 'none'} of {len(hosts)} host(s)"],
    )
    return job, stacks, errors, notes


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


def _one_host(
    host: str, argv: list[str], via: str, timeout: float, env: Mapping[str, str] | None, redactor: Redactor
) -> StacksReport | RankError:
    res = _run(argv, timeout, env)
    stderr = redactor.text(res.stderr)
    if res.timed_out or res.rc != 0:
        return classify_failure(host, via, res.rc, stderr, timed_out=res.timed_out, timeout=timeout)
    return parse_report(host, res.stdout)


def _srun_all(
    job: str, hosts: list[str], remote: list[str], timeout: float, redactor: Redactor
) -> dict[str, StacksReport | RankError]:
    """One srun step for all nodes; each task's labelled output is its node's report."""
    res = _run(srun_argv(job, hosts, remote), timeout)
    out: dict[str, StacksReport | RankError] = {}
    by_task = split_labelled(res.stdout)
    reports = [parse_report(f"task {t}", text) for t, text in sorted(by_task.items())]
    for rep in reports:
        if isinstance(rep, StacksReport):
            # the report names its node; map it back onto the hostlist entry
            names = {r.host for r in rep.job.ranks} | set(rep.job.hosts)
            host = next((h for h in hosts if h in names or any(n.split(".")[0] == h for n in names)), None)
            if host is None:
                host = next((h for h in hosts if h not in out), f"node{len(out)}")
            out[host] = rep
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
) -> StacksReport:
    """Capture the stacks of a job's ranks on every host of ``target`` at once and judge them together.

    ``target.hosts``: node names (Slurm hostlists already expanded by the target); without them,
    the Slurm allocation's nodes (SLURM_JOB_NODELIST) or, with ``via="kubectl"``, the running pods
    of ``target.job``. Each host runs ``rankscope stacks --local --json`` with every option of
    ``options`` (:func:`stacks_argv`). ``pid`` is the pid to inspect on every host, ``pids`` maps
    a host to its own (overriding ``pid`` there).
    """
    if target.via == "debug-server":
        return dump_stacks_debug_server(target, options)
    via, timeout = target.via, options.timeout
    host_list = _host_list(target, timeout)
    redactor = Redactor()
    started = time.monotonic()

    def argv_for(host: str | None) -> list[str]:
        remote = stacks_argv(
            options, rankscope_cmd=target.rankscope_cmd, pid=(pids or {}).get(host or "", pid)
        )
        if via == "ssh" and host is not None:
            return ssh_argv(host, remote, timeout=timeout, ssh_options=ssh_options)
        if via == "kubectl" and host is not None:
            return kubectl_exec_argv(host, remote, target.namespace)
        return remote

    results: dict[str, StacksReport | RankError]
    if via == "srun":
        _need("srun", "srun")
        slurm_job = target.job or os.environ.get("SLURM_JOB_ID")
        if not slurm_job:
            raise InvalidInput("--via srun needs the Slurm job id", "Pass --job JOBID (see `squeue --me`).")
        results = _srun_all(slurm_job, host_list, argv_for(None), timeout + options.window + 5.0, redactor)
    else:
        if via in ("ssh", "kubectl"):
            _need(via, via)
        env_for: Callable[[str], Mapping[str, str] | None] = (
            (lambda h: {**os.environ, "RANKSCOPE_HOSTNAME": h}) if via == "local" else (lambda h: None)
        )
        with ThreadPoolExecutor(max_workers=min(64, len(host_list))) as pool:
            futures = {
                h: pool.submit(_one_host, h, argv_for(h), via, timeout + options.window, env_for(h), redactor)
                for h in host_list
            }
            results = {h: f.result() for h, f in futures.items()}

    return _judge_hosts(results, host_list, f"collected via {via} in {time.monotonic() - started:.1f}s")


def _judge_hosts(
    results: Mapping[str, StacksReport | RankError], host_list: list[str], note: str
) -> StacksReport:
    """One verdict from every host's report (and each failed host's error)."""
    reports = {h: r for h, r in results.items() if isinstance(r, StacksReport)}
    failed = [r for r in results.values() if isinstance(r, RankError)]
    merged_job, stacks, errors, _ = merge_reports(reports, failed, host_list)
    merged_job = merged_job.model_copy(update={"notes": [*merged_job.notes, note]})
    from rankscope.analysis.hang.progress import merge_progress
    from rankscope.analysis.hang.stacks import analyze

    progress = merge_progress(
        [r.progress for r in reports.values() if r.progress is not None], merged_job.backend
    )
    return account_for_unseen(analyze(merged_job, stacks, errors, progress=progress), failed)


__all__ = [
    "classify_failure",
    "dump_stacks_remote",
    "expand_hostlist",
    "hosts_from_environment",
    "kubectl_exec_argv",
    "kubectl_get_pods_argv",
    "merge_reports",
    "parse_report",
    "pods_from_json",
    "split_labelled",
    "srun_argv",
    "ssh_argv",
    "stacks_argv",
]
