"""Hosts of a cluster on one machine, for the multi-host tests.

Each node is a PID + UTS + mount namespace with its own hostname and its own sshd on a free port
of 127.0.0.1: a process on node1 cannot see node2's processes, and ssh is the only way in, as on
a real cluster. The filesystem (the job's folder, the virtual environment) and the network stay
shared, as a cluster's shared filesystem and fabric. The caller's side is a login namespace: a
fresh PID namespace that sees no node's processes, where ``ssh nodeK`` works because the nodes'
ssh config is bound over ~/.ssh there (the home folder's own ~/.ssh is never edited).

Nothing here sleeps a fixed time: each sshd is polled with `ssh nodeK true`, jobs by their readiness
files. ``down`` kills each node's process group (its sshd is the namespace's first process, so
everything the node started dies with it). Needs root, ``unshare`` and Debian's openssh-server.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.runtime.proctree import reap_tree
from tests.jobs import free_port, job_env, tail, wait_for

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)
LOGIN_PATH = "/usr/local/bin:/usr/bin:/bin"
"""The PATH of a command on a node or the login namespace: the system's, no virtual environment."""


@dataclass
class Nodes:
    """Running nodes: ``names`` (node1..nodeN), each reached with ``ssh NAME`` under ``ssh_config``.

    ``bin`` is the first folder of every node's PATH: a test links rankscope there to put it on
    the nodes' PATH, and removes the link to take it off.
    """

    state: Path
    names: list[str]
    ports: dict[str, int]
    bin: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def ssh_config(self) -> Path:
        return self.state / "home" / ".ssh" / "config"

    def ssh(self, host: str, command: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a shell command line on ``host`` (from this machine, with the nodes' config)."""
        return subprocess.run(
            ["ssh", "-F", str(self.ssh_config), "-n", "-o", "BatchMode=yes", host, command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(
        self, host: str, folder: Path, argv: Sequence[str], env: Mapping[str, str], log: Path | None = None
    ) -> None:
        """Start ``argv`` detached on ``host`` in ``folder`` with ``env`` added, its output in
        ``folder/HOST.log`` (as a scheduler starts a launcher), or appended to ``log`` (one log of
        every node, as a batch job's); returns once it is started."""
        assigns = [f"{k}={v}" for k, v in env.items()]
        to = f">> {shlex.quote(str(log))}" if log else f"> {shlex.quote(str(folder / f'{host}.log'))}"
        line = (
            f"cd {shlex.quote(str(folder))} && env {shlex.join(assigns)} setsid -f {shlex.join(argv)} "
            f"{to} 2>&1 < /dev/null"
        )
        res = self.ssh(host, line)
        if res.returncode != 0:
            raise RuntimeError(f"could not start {argv[:3]} on {host}: {res.stderr}")

    def login(
        self, argv: Sequence[str], cwd: Path, timeout: float = 120.0, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as on a login node, in ``cwd``: a fresh PID namespace that sees none of the
        nodes' processes, where ``ssh nodeK`` reaches the nodes (their config bound over ~/.ssh in
        that namespace only)."""
        script = 'mkdir -p -m 700 "$2" && mount --bind "$1" "$2" && cd "$3" && shift 3 && exec "$@"'
        return subprocess.run(
            [
                "unshare",
                "--pid",
                "--kill-child",  # a timed-out call leaves nothing behind: its namespace dies with it
                "--mount-proc",
                "sh",
                "-c",
                script,
                "login",
                str(self.ssh_config.parent),
                str(HOME / ".ssh"),
                str(cwd),
                *argv,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"PATH": LOGIN_PATH, "HOME": str(HOME), **(env or {})},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def down(self) -> None:
        """Stop every node: its session's process group, then whatever is left of its tree."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            reap_tree(proc, grace=2.0)
        self.procs.clear()


def _keygen(path: Path) -> None:
    if not path.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30
        )


def _sshd_config(nodes: Nodes, name: str, port: int) -> Path:
    d = nodes.state / name
    d.mkdir(parents=True, exist_ok=True)
    lines = [
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {nodes.state / 'hostkey'}",
        f"PidFile {d / 'sshd.pid'}",
        "PermitRootLogin yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        f"AuthorizedKeysFile {nodes.state / 'authorized_keys'}",
        f"SetEnv PATH={nodes.bin}:{LOGIN_PATH}",
    ]
    (d / "sshd_config").write_text("\n".join(lines) + "\n")
    return d


def _client_config(nodes: Nodes) -> None:
    user = pwd.getpwuid(os.getuid()).pw_name
    blocks = []
    for name in nodes.names:
        blocks += [
            f"Host {name}",
            "  HostName 127.0.0.1",
            f"  Port {nodes.ports[name]}",
            f"  User {user}",
            f"  IdentityFile {nodes.state / 'id_ed25519'}",
            "  IdentitiesOnly yes",
            "  StrictHostKeyChecking no",
            "  UserKnownHostsFile /dev/null",
            "  LogLevel ERROR",
        ]
    nodes.ssh_config.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    nodes.ssh_config.write_text("\n".join(blocks) + "\n")
    nodes.ssh_config.chmod(0o600)


def nodes_up(state: Path, n: int) -> Nodes:
    """Start node1..nodeN under ``state`` and wait until ``ssh nodeK true`` works on each."""
    if os.getuid() != 0 or shutil.which("unshare") is None or not Path(SSHD).exists():
        raise RuntimeError(
            "the node fixture needs root, unshare and sshd (apt-get install -y openssh-server)"
        )
    names = [f"node{k}" for k in range(1, n + 1)]
    nodes = Nodes(state=state, names=names, ports={h: free_port() for h in names}, bin=state / "bin")
    nodes.bin.mkdir(parents=True, exist_ok=True)
    _keygen(state / "id_ed25519")
    _keygen(state / "hostkey")
    shutil.copy(state / "id_ed25519.pub", state / "authorized_keys")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    _client_config(nodes)
    try:
        for name in names:
            d = _sshd_config(nodes, name, nodes.ports[name])
            with open(d / "sshd.log", "wb") as log:
                nodes.procs.append(
                    subprocess.Popen(
                        [
                            "unshare",
                            "--pid",
                            "--kill-child",
                            "--mount-proc",
                            "--uts",
                            "sh",
                            "-c",
                            'hostname "$0" && exec "$@"',
                            name,
                            SSHD,
                            "-D",
                            "-e",
                            "-f",
                            str(d / "sshd_config"),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        for name, proc in zip(names, nodes.procs, strict=True):

            def answers(name: str = name, proc: subprocess.Popen[bytes] = proc) -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name}'s sshd exited: {(state / name / 'sshd.log').read_text()}")
                return nodes.ssh(name, "true", timeout=10).returncode == 0

            def sshd_log(name: str = name) -> str:
                return f"its log: {tail((state / name / 'sshd.log').read_text(errors='replace'))}"

            wait_for(answers, 30, f"the sshd of {name} to answer `ssh {name} true`", 0.1, sshd_log)
    except BaseException:
        nodes.down()
        raise
    return nodes


def torchrun_on_nodes(
    nodes: Nodes,
    folder: Path,
    program: Path,
    args: Sequence[str],
    *,
    nproc: int,
    ready: Path,
    env: Mapping[str, str] | None = None,
) -> int:
    """One torchrun job over every node (``--nnodes N --node_rank K``, a static rendezvous on
    127.0.0.1 at a free port), started in ``folder``; returns the port. The ranks mark their
    readiness under ``ready``."""
    port = free_port()
    base = job_env()
    job = {
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": base["PYTHONPATH"],
        "RANKSCOPE_TEST_READY": str(ready),
        **(env or {}),
    }
    for k, name in enumerate(nodes.names):
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={len(nodes.names)}",
            f"--node_rank={k}",
            f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            "--monitor_interval=0.2",
            str(program),
            *args,
        ]
        nodes.start(name, folder, argv, job)
    return port


def job_progress(*folders: Path) -> str:
    """Which ranks of jobs started by ``torchrun_on_nodes`` marked themselves ready, and their
    agents' last output (``folder/HOST.log``): what a wait for those jobs says when it runs out."""
    marked = {
        f.name: sorted(p.name for p in (f / "ready").iterdir()) for f in folders if (f / "ready").is_dir()
    }
    last = {
        f"{f.name}/{p.name}": tail(p.read_text(errors="replace"))
        for f in folders
        for p in sorted(f.glob("node*.log"))
    }
    return f"ranks marked ready: {marked}; the agents' last output: {last}"
