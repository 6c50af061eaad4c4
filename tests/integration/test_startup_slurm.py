"""A Slurm job whose srun step started on two of its three nodes (tests/slurm.py, a real Slurm).

The batch script runs one torchrun agent per node with ``--nnodes=3``, but its step is started
on node1 and node2 only: both agents wait in rendezvous for node_rank 2, which never comes.
``rankscope stacks --via srun --job ID`` from the login node reaches all three nodes of the
allocation and names node3, where no launcher of the job runs.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope.runtime import procfs
from tests.jobs import PROGRAMS, free_port, job_env, wait_for
from tests.slurm import SlurmCluster, slurm_cluster

BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _agents(folder: Path) -> int:
    """The job's torchrun agents that have torch loaded (then they wait in rendezvous), seen from
    this machine, which sees every node's processes."""
    return sum(
        procfs.maps_mention(pid, (b"libtorch",))
        for pid in procfs.pids()
        if "torch.distributed.run" in (argv := procfs.read_cmdline(pid)) and str(folder) in argv
    )


@pytest.fixture(scope="module")
def step_on_two_of_three(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SlurmCluster, str, Path]]:
    with slurm_cluster(tmp_path_factory.mktemp("slurm3"), nodes=3) as cluster:
        folder = tmp_path_factory.mktemp("job")
        port = free_port()
        torchrun = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=3", "--node_rank=NODE", "--nproc_per_node=2",
            "--master_addr=127.0.0.1", f"--master_port={port}", "--monitor_interval=0.2",
            str(PROGRAMS / "startup_wait.py"), str(folder),
        ]  # fmt: skip
        agent = shlex.join(torchrun).replace("--node_rank=NODE", '--node_rank="$SLURM_NODEID"')
        command = "srun -N2 -w node1,node2 --ntasks-per-node=1 sh -c " + shlex.quote(f"exec {agent}")
        job = cluster.sbatch(command, log=folder / "job.log", env=job_env(), cwd=folder, nodes=3)

        def up() -> bool:
            if cluster.state_of(job) not in ("RUNNING", "PENDING", "CONFIGURING"):
                raise RuntimeError(f"job {job} ended: {(folder / 'job.log').read_text(errors='replace')}")
            listening = any(s.listening for s in procfs.tcp_sockets(frozenset({port})))
            return _agents(folder) >= 2 and listening

        try:
            wait_for(up, 120, f"the two torchrun agents of Slurm job {job}", 0.2)
            yield cluster, job, folder
        finally:
            cluster.cancel(job)


def test_the_node_the_step_did_not_start_on(step_on_two_of_three: tuple[SlurmCluster, str, Path]) -> None:
    cluster, job, folder = step_on_two_of_three
    env = {"PATH": f"{BIN}:{cluster.env['PATH']}"}
    res = cluster.run(
        sys.executable, "-m", "rankscope", "stacks", "--via", "srun", "--job", job, "--json",
        timeout=180.0, env=env, cwd=folder,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    verdict = json.loads(res.stdout)["verdict"]
    assert verdict["kind"] == "startup", verdict
    assert "2 of 3 nodes joined (node1, node2); node3 (node_rank 2) runs no launcher" in verdict["summary"]
    assert "its step did not start there" in verdict["summary"]
