"""Cross-host collection: run ``rankscope stacks --local --json`` on every node at once, merge, judge.

rankscope brings no daemon: it uses the engines the cluster already has.
``ssh`` (BatchMode, the user's own config and keys), one ``srun --overlap``
step inside the job's Slurm allocation, or ``kubectl exec`` into the job's
pods. Every host runs concurrently with its own timeout; a host that cannot be
reached, lacks rankscope, times out or refuses the key becomes a ``RankError``
for that host with the fix, and the other hosts' ranks still arrive. The
per-host reports are merged into one ``Job`` and judged once by
``rankscope.analysis.hang.stacks.analyze``, so ranks nobody could see count as
missing.

Command construction and output parsing are pure functions (tested against the
tools' documented syntax); only :func:`dump_stacks_remote` and its runners
start processes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from rankscope.analysis.hostlist import expand_hostlist, host_port
from rankscope.analysis.ranges import ranks_phrase
from rankscope.analysis.redact import Redactor
from rankscope.errors import InvalidInput
from rankscope.models.core import (
    Frame,
    Job,
    NextStep,
    RankError,
    RankProcess,
    RankStack,
    StacksReport,
    ThreadStack,
)
from rankscope.options import DEFAULTS, LOCAL, OPTION_FLAGS, DumpOptions, StacksTarget, option_flags
from rankscope.runtime import net, subproc, tcpstore

log = logging.getLogger("rankscope.capabilities.remote")

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
                "srun": "Run rankscope on a node of the Slurm cluster (where srun works), or use --via ssh.",
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


# ---------------------------------------------------------------------------------------------
# PyTorch's debug server (torch.distributed.debug.start_debug_server): no ssh at all
# ---------------------------------------------------------------------------------------------

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


def dump_stacks_debug_server(target: StacksTarget, options: DumpOptions = DEFAULTS) -> StacksReport:
    """Stacks (and, unless ``options.flight_recorder`` is off, flight-recorder traces) of every rank
    through their PyTorch debug servers, found in the store ``target.hosts[0]`` or ``target.job``
    (else MASTER_ADDR:MASTER_PORT)."""
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
    from rankscope.analysis.hang.stacks import analyze
    from rankscope.analysis.recorder.flight import LoadedDump
    from rankscope.analysis.recorder.flight import analyze as analyze_flight

    dumps = [
        LoadedDump(path=f"{urls[i]}/handler/fr_trace_json", rank=i, format="json", data=t)
        for i, (_, _, t) in enumerate(results)
        if t
    ]
    flight = analyze_flight(dumps, world_size=len(urls)) if dumps else None
    report = analyze(job_model, stacks, errors, flight)
    if flight is not None and "flight recorder" not in report.verdict.summary:
        evidence = [
            *report.verdict.evidence,
            f"flight recorder ({flight.verdict.kind}): {flight.verdict.summary}",
        ]
        report = report.model_copy(
            update={"verdict": report.verdict.model_copy(update={"evidence": evidence})}
        )
    return report


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
    "debug_server_trace",
    "debug_server_urls",
    "dump_stacks_debug_server",
    "dump_stacks_remote",
    "expand_hostlist",
    "hosts_from_environment",
    "kubectl_exec_argv",
    "kubectl_get_pods_argv",
    "merge_reports",
    "parse_faulthandler",
    "parse_report",
    "pods_from_json",
    "split_labelled",
    "srun_argv",
    "ssh_argv",
    "stacks_argv",
]
