"""One `rankscope watch` from a login node over every node of a job: over ssh (tests/nodes.py) and
over ``srun --overlap`` steps of a real Slurm (tests/slurm.py).

The same hang each time: a 2-rank job over two namespaced nodes (rank 0 on node1, rank 1 on node2)
trains until the test says go, then rank 1, on node2, blocks in a data read (no collective, nothing
in any log) while rank 0 waits in all_reduce until the job's own 30 s timeout ends it. One rank per
node is enough: a rank in no collective while another waits in one is named without a majority,
and each node still holds a rank the watch must sample. The watch runs on the login side, which
sees no rank. Before the stall, node2's sampler is killed: the watch must say so (host gone, in its
manifest and in triage's answer) and go on; at the stall it still asks every node, so the incident
holds both nodes' looks, and triage names rank 1 and its line.

Thresholds are short (options); each node's rankscope is the one these tests import (a wrapper on
the ssh nodes' PATH; the Slurm steps inherit the caller's environment).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import rankscope
from rankscope.capabilities import watch_folder as wf
from rankscope.models.watch import WatchManifest
from tests.jobs import PROGRAMS, free_port, job_env, run_cli, tail, torchrun_argv, wait_for
from tests.nodes import Nodes, job_progress, torchrun_on_nodes
from tests.slurm import SlurmCluster, slurm_cluster

pytestmark = pytest.mark.slow

TOOLS = Path(rankscope.__file__).resolve().parents[1]
FAST = ["--interval", "0.5", "--stall", "3", "--confirm", "0.5", "--json"]
JOB_ARGS = ["--mode", "data", "--odd", "1", "--dist-timeout", "30", "--store", "env"]
WATCH_S = 300.0


def _ready(folder: Path, nodes_log: Callable[[], str]) -> None:
    wait_for(
        lambda: len(list((folder / "ready").glob("up-rank*"))) == 2,
        180,
        "the job's 2 ranks on node1 and node2 to start",
        0.2,
        nodes_log,
    )


@pytest.fixture(scope="module")
def ssh_job(nodes: Nodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The job over the ssh nodes, with the tests' rankscope on the nodes' PATH."""
    wrapper = nodes.bin / "rankscope"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(TOOLS))} exec {shlex.quote(sys.executable)} -m rankscope "$@"\n'
    )
    wrapper.chmod(0o755)
    folder = tmp_path_factory.mktemp("watched-ssh")
    (folder / "ready").mkdir()
    args = [*JOB_ARGS, "--go", str(folder / "go")]
    torchrun_on_nodes(nodes, folder, PROGRAMS / "watch_jobs.py", args, nproc=1, ready=folder / "ready")
    try:
        _ready(folder, lambda: job_progress(folder))
        yield folder
    finally:
        wrapper.unlink(missing_ok=True)


class Watch:
    """A watch run in the foreground in a thread (as on a login node), its result once it ends."""

    def __init__(self, run: Callable[[], subprocess.CompletedProcess[str]]) -> None:
        self.result: subprocess.CompletedProcess[str] | None = None
        self.thread = threading.Thread(target=self._go, args=(run,), daemon=True)
        self.thread.start()

    def _go(self, run: Callable[[], subprocess.CompletedProcess[str]]) -> None:
        self.result = run()

    def done(self) -> subprocess.CompletedProcess[str]:
        self.thread.join(WATCH_S + 30)
        assert self.result is not None, "the watch did not end"
        return self.result


def _manifest(out: Path) -> WatchManifest | None:
    try:
        return wf.read_watch(out)
    except Exception:
        return None


def _host_state(out: Path, host: str) -> str | None:
    m = _manifest(out)
    return next((h.state for h in m.hosts if h.host == host), None) if m else None


def _watch_and_hang(out: Path, folder: Path, watch: Watch, kill_node2_sampler: Callable[[], None]) -> None:
    """Once both nodes are watched, kill node2's sampler, wait for the watch to say it is gone, then
    let rank 1 hang; return once the watch ended with the job."""

    def watching() -> bool:
        if watch.result is not None:
            raise RuntimeError(f"the watch ended early: {watch.result.stderr[-3000:]}")
        return _host_state(out, "node1") == "watching" and _host_state(out, "node2") == "watching"

    wait_for(watching, 120, "the watch to sample node1 and node2", 0.2)
    kill_node2_sampler()
    wait_for(lambda: _host_state(out, "node2") == "gone", 60, "the watch to mark node2 gone", 0.2)
    (folder / "go").touch()


def _line(code: str) -> int:
    """The line of watch_jobs.py that holds ``code``."""
    lines = (PROGRAMS / "watch_jobs.py").read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if code in text)


def _check(out: Path, result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = wf.read_watch(out)
    assert manifest.state == "job_ended", manifest
    node2 = next(h for h in manifest.hosts if h.host == "node2")
    assert node2.state == "gone" and node2.note, manifest.hosts
    assert len(manifest.incidents) == 1, manifest.incidents
    path = wf.incident_paths(out)[0]
    incident = wf.read_incident(path)
    assert incident.complete and incident.status == "stalled", incident
    assert sorted(f.name for f in path.glob("look-*.json")) == ["look-node1.json", "look-node2.json"]
    assert not incident.hosts_missing, incident.hosts_missing
    assert "judged without the samples of node2" in incident.reason, incident.reason
    done = run_cli("triage", str(out), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["suspect_ranks"] == [1], answer["summary"]
    text = json.dumps(answer)
    line = _line('with open(path, "rb")')  # read_shard's open of the FIFO
    assert f"rank 1 is in no collective, at watch_jobs.py:{line}" in answer["summary"], answer["summary"]
    assert "read_shard" in (path / "look-node2.json").read_text()  # rank 1's own frames, from node2
    assert any(line.startswith("host node2: gone") for line in answer["watch"]), answer["watch"]
    assert "node1" in text


def test_a_watch_over_ssh_captures_every_node_and_says_which_sampler_went(
    nodes: Nodes, ssh_job: Path, pyspy_works: str, tmp_path: Path
) -> None:
    out = tmp_path / "watch"
    argv = [sys.executable, "-m", "rankscope", "watch", "--hosts", "node1,node2", "--out", str(out), *FAST]
    env = {"PYTHONPATH": str(TOOLS)}
    watch = Watch(lambda: nodes.login(argv, ssh_job, timeout=WATCH_S, env=env))

    def kill() -> None:
        found = nodes.ssh("node2", "pgrep -f '[-]m rankscope watch --sampler'")
        pids = found.stdout.split()
        assert pids, found.stderr
        nodes.ssh("node2", f"kill -KILL {' '.join(pids)}")

    _watch_and_hang(out, ssh_job, watch, kill)
    _check(out, watch.done())


@pytest.fixture(scope="module")
def slurm_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmCluster, str, Path]]:
    """The job over a real Slurm's two namespaced nodes: one torchrun agent per node (srun)."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm-watch"), nodes=2) as cluster:
        folder = tmp_path_factory.mktemp("watched-srun")
        (folder / "ready").mkdir()
        port = free_port()
        argv = torchrun_argv(
            "watch_jobs.py",
            "--nnodes=2",
            "--node_rank=SLURM_NODEID",
            "--nproc_per_node=1",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            args=[*JOB_ARGS, "--go", str(folder / "go")],
        )
        command = shlex.join(argv).replace("--node_rank=SLURM_NODEID", '--node_rank="$SLURM_NODEID"')
        command = "srun --ntasks-per-node=1 sh -c " + shlex.quote(f"exec {command}")
        env = job_env({"RANKSCOPE_TEST_READY": str(folder / "ready"), "MASTER_PORT": str(port)})
        log = folder / "job.log"
        job = cluster.sbatch(command, log=log, env=env, cwd=folder, nodes=2)
        _ready(folder, lambda: f"state {cluster.state_of(job)!r}; its output: {tail(_read(log))}")
        yield cluster, job, folder


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _sampler_on(cluster: SlurmCluster, node: str) -> list[int]:
    """The pids of the watch's sampler in this cluster's Slurm step on ``node`` (this namespace sees
    the nodes'; another cluster's node2, another run's, is told apart by its SLURM_CONF)."""
    conf = f"SLURM_CONF={cluster.env['SLURM_CONF']}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--sampler" in argv and f"SLURMD_NODENAME={node}".encode() in env and conf in env:
            found.append(int(entry.name))
    return found


def test_a_watch_over_srun_steps_captures_every_node_and_says_which_step_went(
    slurm_job: tuple[SlurmCluster, str, Path], pyspy_works: str, tmp_path: Path
) -> None:
    cluster, job, folder = slurm_job
    out = tmp_path / "watch"
    argv = [
        sys.executable,
        "-m",
        "rankscope",
        "watch",
        "--via",
        "srun",
        "--job",
        job,
        "--out",
        str(out),
        *FAST,
    ]
    bin_path = f"{Path(sys.executable).parent}:{cluster.env['PATH']}"
    watch = Watch(lambda: cluster.run(*argv, timeout=WATCH_S, env={"PATH": bin_path}, cwd=tmp_path))

    def kill() -> None:
        pids = _sampler_on(cluster, "node2")
        assert pids, "no sampler found in node2's step"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    _watch_and_hang(out, folder, watch, kill)
    _check(out, watch.done())
