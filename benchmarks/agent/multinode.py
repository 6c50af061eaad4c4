"""A multi-node incident: nodes on this machine, jobs over them, and a login namespace for the agent.

The nodes are tests/nodes.py's (a PID + UTS + mount namespace each, with its own sshd; the
filesystem and 127.0.0.1 shared, as a cluster's shared filesystem and fabric). Every job in the
incident's ``job.json`` runs over all nodes (``torchrun --nnodes N``) from a folder of its own
under the workdir, with the job's interpreter, this repository's virtual environment, as on a
cluster where rankscope is installed in the job's environment but not on the nodes' PATH.

Beside the workdir, in ``WORKDIR.nodes/``: the nodes' state, ``login`` (the AGENT_WRAP that
agentrun.sh prefixes: it runs a command in a fresh PID namespace that sees no rank, where
``ssh nodeK`` works) and ``arm-rankscope/`` and ``arm-shell/`` (each arm's ARM_PATH).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.jobs import free_port, wait_for  # noqa: E402
from tests.nodes import Nodes, nodes_up  # noqa: E402

from rankscope.runtime.proctree import descendants, reap_tree  # noqa: E402

LOGIN = """#!/bin/sh
# Run "$@" as on the cluster's login node: a fresh PID namespace that sees none of the nodes'
# processes, where `ssh node1` ... reach the nodes (their ssh config bound over ~/.ssh here only).
exec unshare --pid --kill-child --mount-proc sh -c \\
  'mkdir -p -m 700 "$HOME/.ssh" && mount --bind "$0" "$HOME/.ssh" && exec "$@"' {ssh_dir} "$@"
"""


def state_dir(workdir: Path) -> Path:
    return workdir.parent / f"{workdir.name}.nodes"


def _tools(state: Path, bin_dir: Path) -> None:
    """The nodes' PATH gets py-spy; each arm's ARM_PATH its tools (rankscope for one arm only)."""
    venv_bin = Path(sys.executable).parent
    py_spy = shutil.which("py-spy", path=str(venv_bin)) or shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy not found (pip install py-spy in the job's environment)")
    for folder, tools in (
        (bin_dir, {"py-spy": py_spy}),
        (state / "arm-shell", {"py-spy": py_spy}),
        (state / "arm-rankscope", {"py-spy": py_spy, "rankscope": str(venv_bin / "rankscope")}),
    ):
        folder.mkdir(parents=True, exist_ok=True)
        for name, target in tools.items():
            (folder / name).unlink(missing_ok=True)
            (folder / name).symlink_to(target)


def _start_job(nodes: Nodes, folder: Path, job: dict[str, Any]) -> None:
    port = free_port()
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    for k, name in enumerate(nodes.names):
        argv = [
            sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(nodes.names)}",
            f"--node_rank={k}", f"--nproc_per_node={job['nproc']}", "--master_addr=127.0.0.1",
            f"--master_port={port}", "train.py",
        ]  # fmt: skip
        nodes.start(name, folder, argv, env)


def _printed(folder: Path, text: str) -> bool:
    log = folder / "node1.log"
    return log.is_file() and text in log.read_text(errors="replace")


def set_up(spec: dict[str, Any], jobs_dir: Path, workdir: Path, wait_s: float = 300.0) -> None:
    """Bring the nodes up, start every job over them, and wait until each has printed its
    ``ready`` line (job A: the step after which it hangs), then ``settle_s``."""
    state = state_dir(workdir)
    if (state / "nodes.json").is_file():
        raise SystemExit(
            f"{workdir} is set up already: stop it first (setup_incident.py stop --workdir {workdir})"
        )
    state.mkdir(parents=True, exist_ok=True)
    nodes = nodes_up(state, int(spec["nodes"]))
    (state / "nodes.json").write_text(json.dumps({"pids": [p.pid for p in nodes.procs]}))
    _tools(state, nodes.bin)
    login = state / "login"
    login.write_text(LOGIN.format(ssh_dir=nodes.ssh_config.parent))
    login.chmod(0o755)
    folders = []
    for job in spec["jobs"]:
        folder = workdir / job["folder"]
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(jobs_dir / job["script"], folder / "train.py")
        if job.get("prepare"):  # the job's data, made by a script the agent never sees
            subprocess.run(
                [sys.executable, str(jobs_dir / job["prepare"])], cwd=folder, check=True, timeout=300
            )
        _start_job(nodes, folder, job)
        folders.append((folder, job["ready"]))
    try:
        wait_for(lambda: all(_printed(f, r) for f, r in folders), wait_s, "every job's ready line", 0.5)
    except TimeoutError:
        stop(workdir)
        raise
    time.sleep(float(spec.get("settle_s", 5)))


def _launchers(node_pid: int) -> list[int]:
    """The torchrun launchers a node runs (its sshd adopted them when their ssh session ended)."""
    found = []
    for pid in descendants(node_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"torch.distributed.run" in cmdline[:3]:
            found.append(pid)
    return found


def stop(workdir: Path) -> None:
    """Stop every job by its launcher's process tree, then each node (its sshd's process group
    and tree: the node's PID namespace dies with it, and whatever it still ran)."""
    path = state_dir(workdir) / "nodes.json"
    if not path.is_file():
        return
    pids: list[int] = json.loads(path.read_text())["pids"]
    for node_pid in pids:
        for launcher in _launchers(node_pid):
            reap_tree(launcher)
    for node_pid in pids:
        try:
            os.killpg(node_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap_tree(node_pid, grace=2.0)
    path.unlink()
