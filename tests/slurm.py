"""A real Slurm for the tests: munged, slurmctld and slurmd of Debian's slurm-wlm (installed by
``.ci/setup``), started in a temporary state folder and stopped at teardown.

One node (the default) is this machine under its own hostname. With ``nodes=N`` (N >= 2) each
node is a slurmd in its own PID, UTS and mount namespace named node1..nodeN, with its own
SlurmdPort on 127.0.0.1: a job step on node1 sees only node1's processes, as on a real cluster,
while the filesystem stays shared (a cluster's shared home). The caller is the login node.

Everything this cluster needs lives in its folder: a generated munge key and socket, a
generated slurm.conf (free ports, proctrack/linuxproc, task/none, no accounting and no
cgroup), the daemons' state, spool, pid and log files. Clients find it through SLURM_CONF
(:attr:`SlurmCluster.env`), so a Slurm of the machine itself, if any, is never touched.

The readiness signal is the nodes themselves: ``sinfo`` says ``idle``. Teardown cancels the
jobs, then reaps each daemon's process tree by its recorded pid. Each slurmd runs under a
child subreaper, so the slurmstepd it starts (which leaves slurmd's tree by daemonizing) and
every process of a job stay in that tree, and are reaped with it even when a test failed half way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.runtime.proctree import reap_tree
from tests.jobs import free_port, wait_for

DAEMONS = ("munged", "slurmctld", "slurmd")

SUBREAPER = (
    "import ctypes, os, signal, socket, subprocess, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER\n"
    "if sys.argv[1] != '-':\n"
    "    socket.sethostname(sys.argv[1])  # a node of its own UTS namespace\n"
    "signal.signal(signal.SIGTERM, lambda *_: None)  # its tree gets the signal too: stay to reap it\n"
    "subprocess.Popen(sys.argv[2:])\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        break\n"
)
"""``python -c SUBREAPER HOSTNAME|- CMD...``: run CMD under a child subreaper (the first process
of a PID namespace is one anyway): the orphans of its tree (a daemonized slurmstepd and the job's
processes) are re-parented to it, reaped by it, and it exits when none is left."""


def _daemon(name: str) -> str:
    """The daemon's path (they live in /usr/sbin, often not on a user's PATH)."""
    found = shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d, name)).exists()), None
    )
    assert found, f"{name} missing: run `bash .ci/setup` as root (apt-get install slurm-wlm munge)"
    return found


def slurm_conf(state: Path, nodes: Sequence[tuple[str, int]], cpus: int, ctld_port: int) -> str:
    """A slurm.conf for ``nodes`` (name, slurmd port), everything under ``state``, root running the daemons."""
    names = ",".join(name for name, _ in nodes)
    return "\n".join(
        [
            "ClusterName=rankscope",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={state / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={state / 'ctld'}",
            f"SlurmdSpoolDir={state / 'spool-%n'}",
            f"SlurmctldPidFile={state / 'slurmctld.pid'}",
            f"SlurmdPidFile={state / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={state / 'slurmctld.log'}",
            f"SlurmdLogFile={state / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=300",
            "SchedulerType=sched/builtin",
            *(
                f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} State=UNKNOWN"
                for name, port in nodes
            ),
            f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8",
            "",
        ]
    )


@dataclass
class SlurmCluster:
    """A running cluster: its folder, its nodes' names, and the environment its clients need."""

    state: Path
    nodes: list[str]
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)

    def run(
        self,
        *argv: str,
        timeout: float = 15.0,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (in ``cwd``), output captured as text."""
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**self.env, **(env or {})},
            cwd=cwd,
        )

    def sbatch(
        self,
        command: str,
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        nodes: int = 1,
    ) -> str:
        """``sbatch --nodes N --wrap COMMAND``; the job's id (it is cancelled at teardown)."""
        argv = ["sbatch", "--parsable", f"--nodes={nodes}", f"--output={log}", "--wrap", command]
        if cwd is not None:
            argv.insert(1, f"--chdir={cwd}")
        res = self.run(*argv, env=env)
        assert res.returncode == 0, f"sbatch failed: {res.stderr}"
        job = res.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job

    def state_of(self, job: str) -> str:
        """The job's state as squeue prints it (RUNNING, CANCELLED, ...; '' once Slurm forgot it)."""
        res = self.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T")
        return res.stdout.strip() if res.returncode == 0 else ""

    def cancel(self, job: str, timeout: float = 15.0) -> None:
        """scancel the job and wait until Slurm no longer runs it."""
        self.run("scancel", job)
        wait_for(
            lambda: self.state_of(job) not in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING"),
            timeout,
            f"job {job} to end",
        )

    def logs(self) -> str:
        """The daemons' logs, for a failure message."""
        out = []
        for name in ("munged.log", "slurmctld.log", *(f"slurmd-{n}.log" for n in self.nodes)):
            with contextlib.suppress(OSError):
                out.append(f"--- {name}\n" + (self.state / name).read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel the jobs, then reap each daemon's tree (slurmd's holds the jobs' processes)."""
        for job in self.jobs:
            with contextlib.suppress(Exception):
                self.cancel(job, timeout=10.0)
        for name in [*self.nodes, "slurmctld", "munged"]:
            if name in self.procs:
                reap_tree(self.procs[name], grace=3.0)


def _start(cluster: SlurmCluster, name: str, argv: Sequence[str]) -> None:
    log = open(cluster.state / f"{name}.out", "wb")
    with log:
        cluster.procs[name] = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=cluster.env,
            start_new_session=True,
        )


def _nodes_idle(cluster: SlurmCluster) -> bool:
    for name, proc in cluster.procs.items():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{cluster.logs()}")
    res = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10.0)
    idle = {line.split()[0] for line in res.stdout.splitlines() if line.endswith(" idle")}
    return res.returncode == 0 and idle >= set(cluster.nodes)


def _prepare(state: Path) -> Path:
    """The folders, and a fresh munge key only this cluster uses."""
    for sub in ("ctld", "munge"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "munge").chmod(0o755)  # munged wants its socket folder searchable by all
    key = state / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    return key


def _slurmd_argv(slurmd: str, conf: Path, node: str | None) -> list[str]:
    """slurmd under a subreaper; for a namespaced node, in a PID, UTS and mount namespace of its own."""
    argv = [sys.executable, "-c", SUBREAPER, node or "-", slurmd, "-D", "-f", str(conf)]
    if node is None:
        return argv
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    return [unshare, "--pid", "--fork", "--mount-proc", "--uts", *argv]


@contextlib.contextmanager
def slurm_cluster(state: Path, nodes: int = 1, timeout: float = 30.0) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and a slurmd per node (this machine's hostname when ``nodes`` is 1,
    namespaced node1..nodeN otherwise); yield once every node is idle."""
    assert os.geteuid() == 0, "the Slurm tests start slurmd, which runs jobs as root: run them as root"
    munged, slurmctld, slurmd = (_daemon(name) for name in DAEMONS)
    key = _prepare(state)
    names = [socket.gethostname().split(".")[0]] if nodes == 1 else [f"node{k}" for k in range(1, nodes + 1)]
    conf = state / "slurm.conf"
    conf.write_text(slurm_conf(state, [(n, free_port()) for n in names], os.cpu_count() or 1, free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    cluster = SlurmCluster(state=state, nodes=names, env={**env, "SLURM_CONF": str(conf)})
    munge_socket = state / "munge" / "munge.socket"
    try:
        _start(
            cluster,
            "munged",
            [
                munged,
                "-F",
                "--force",
                f"--socket={munge_socket}",
                f"--key-file={key}",
                f"--log-file={state / 'munged.log'}",
                f"--pid-file={state / 'munged.pid'}",
                f"--seed-file={state / 'munged.seed'}",
                "--num-threads=2",
            ],
        )
        wait_for(lambda: munge_socket.exists(), timeout, "munged's socket")
        _start(cluster, "slurmctld", [slurmctld, "-D", "-i", "-f", str(conf)])
        for name in names:
            _start(cluster, name, _slurmd_argv(slurmd, conf, None if nodes == 1 else name))
        deadline = time.monotonic() + timeout
        try:
            wait_for(
                lambda: _nodes_idle(cluster), max(1.0, deadline - time.monotonic()), f"{names} idle", 0.2
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{cluster.logs()}") from exc
        yield cluster
    finally:
        cluster.stop()
