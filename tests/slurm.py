"""A real one-node Slurm for the tests: munged, slurmctld and slurmd of Debian's slurm-wlm
(installed by ``.ci/setup``), started in a temporary state folder and stopped at teardown.

Everything this cluster needs lives in its folder: a generated munge key and socket, a
generated slurm.conf (free ports for SlurmctldPort and SlurmdPort, this machine's hostname as
the one node at 127.0.0.1, proctrack/linuxproc, task/none, no accounting and no cgroup), the
daemons' state, spool, pid and log files. Clients find it through SLURM_CONF
(:attr:`SlurmCluster.env`), so a Slurm of the machine itself, if any, is never touched.

The readiness signal is the node itself: ``sinfo`` says ``idle``. Teardown cancels the jobs,
then reaps each daemon's process tree by its recorded pid. slurmd runs under a child subreaper,
so the slurmstepd it starts (which leaves slurmd's tree by daemonizing) and every process of
a job stay in that tree, and are reaped with it even when a test failed half way.
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
    "import ctypes, os, signal, subprocess, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER\n"
    "signal.signal(signal.SIGTERM, lambda *_: None)  # its tree gets the signal too: stay to reap it\n"
    "subprocess.Popen(sys.argv[1:])\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        break\n"
)
"""Run a command under a child subreaper: the orphans of its tree (a daemonized slurmstepd and
the job's processes) are re-parented to this process, which reaps them, and exits when none is left."""


def _daemon(name: str) -> str:
    """The daemon's path (they live in /usr/sbin, often not on a user's PATH)."""
    found = shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d, name)).exists()), None
    )
    assert found, f"{name} missing: run `bash .ci/setup` as root (apt-get install slurm-wlm munge)"
    return found


def slurm_conf(state: Path, node: str, cpus: int, ctld_port: int, slurmd_port: int) -> str:
    """A slurm.conf for one node, everything under ``state``, root running the daemons."""
    return "\n".join(
        [
            "ClusterName=rankscope",
            f"SlurmctldHost={node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={state / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={state / 'ctld'}",
            f"SlurmdSpoolDir={state / 'spool'}",
            f"SlurmctldPidFile={state / 'slurmctld.pid'}",
            f"SlurmdPidFile={state / 'slurmd.pid'}",
            f"SlurmctldLogFile={state / 'slurmctld.log'}",
            f"SlurmdLogFile={state / 'slurmd.log'}",
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
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            "",
        ]
    )


@dataclass
class SlurmCluster:
    """A running one-node cluster: its folder, its node's name, and the environment its clients need."""

    state: Path
    node: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)

    def run(
        self, *argv: str, timeout: float = 15.0, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster, output captured as text."""
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**self.env, **(env or {})},
        )

    def sbatch(
        self, command: str, *, log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> str:
        """``sbatch --wrap COMMAND``; the job's id (it is cancelled at teardown)."""
        argv = ["sbatch", "--parsable", f"--output={log}", "--wrap", command]
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
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            with contextlib.suppress(OSError):
                out.append(f"--- {name}\n" + (self.state / name).read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel the jobs, then reap each daemon's tree (slurmd's holds the jobs' processes)."""
        for job in self.jobs:
            with contextlib.suppress(Exception):
                self.cancel(job, timeout=10.0)
        for name in ("slurmd", "slurmctld", "munged"):
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


def _node_idle(cluster: SlurmCluster) -> bool:
    for name, proc in cluster.procs.items():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{cluster.logs()}")
    res = cluster.run("sinfo", "-h", "-n", cluster.node, "-o", "%t", timeout=10.0)
    return res.returncode == 0 and res.stdout.strip() == "idle"


def _prepare(state: Path) -> Path:
    """The folders, and a fresh munge key only this cluster uses."""
    for sub in ("ctld", "spool", "munge"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "munge").chmod(0o755)  # munged wants its socket folder searchable by all
    key = state / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    return key


@contextlib.contextmanager
def slurm_cluster(state: Path, timeout: float = 30.0) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd for this machine's hostname; yield once the node is idle."""
    assert os.geteuid() == 0, "the Slurm tests start slurmd, which runs jobs as root: run them as root"
    binaries = [_daemon(name) for name in DAEMONS]
    key = _prepare(state)
    node = socket.gethostname().split(".")[0]
    conf = state / "slurm.conf"
    conf.write_text(slurm_conf(state, node, os.cpu_count() or 1, free_port(), free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    cluster = SlurmCluster(state=state, node=node, env={**env, "SLURM_CONF": str(conf)})
    munge_socket = state / "munge" / "munge.socket"
    try:
        _start(
            cluster,
            "munged",
            [
                binaries[0],
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
        _start(cluster, "slurmctld", [binaries[1], "-D", "-i", "-f", str(conf)])
        _start(cluster, "slurmd", [sys.executable, "-c", SUBREAPER, binaries[2], "-D", "-f", str(conf)])
        deadline = time.monotonic() + timeout
        try:
            wait_for(
                lambda: _node_idle(cluster), max(1.0, deadline - time.monotonic()), f"node {node} idle", 0.2
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{cluster.logs()}") from exc
        yield cluster
    finally:
        cluster.stop()
