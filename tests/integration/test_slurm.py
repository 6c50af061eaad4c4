"""`rankscope stacks --via srun` against a real Slurm (tests/slurm.py), collected from outside the
allocation as from a login node (no SLURM_* in the caller's environment).

- One node, this machine: a hung 3-rank gloo job submitted with ``sbatch --wrap "torchrun ..."``.
  Other jobs run on this host beside it (other tests, other people's): the answer must be about
  the Slurm job's ranks only, and rankscope's own srun step is never one of them.
- Two namespaced nodes (each slurmd in its own PID and UTS namespace): a 2-node torchrun job
  started by ``srun`` in the batch script, each node seeing only its own ranks.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from rankscope.mcp_server import build_server
from tests.jobs import free_port, job_env, tail, torchrun_argv, wait_for
from tests.slurm import SlurmCluster, slurm_cluster

BIN = Path(sys.executable).parent
NODE_RANK = "--node_rank=SLURM_NODEID"
"""Replaced by the node's own SLURM_NODEID in the batch script's srun step."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One node: this machine, under its hostname."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """node1 and node2, each its own PID and UTS namespace."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm2"), nodes=2) as running:
        yield running


def _submit(
    cluster: SlurmCluster,
    tmp: Path,
    launcher: list[str],
    odd: int,
    ranks: int,
    nodes: int = 1,
    srun: bool = False,
) -> Iterator[str]:
    """Submit ``torchrun LAUNCHER hang_collectives.py --mode mismatch --odd ODD`` (under ``srun``, one
    agent per node, when ``srun``), yield its id once its ``ranks`` ranks are ready, cancel it after."""
    ready, log = tmp / "ready", tmp / "job.log"
    ready.mkdir()
    port = free_port()
    argv = torchrun_argv(
        "hang_collectives.py",
        *launcher,
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        args=["--mode", "mismatch", "--odd", str(odd)],
    )
    command = shlex.join(argv)
    if srun:  # one torchrun agent per node, its node rank the step's SLURM_NODEID
        command = command.replace(NODE_RANK, '--node_rank="$SLURM_NODEID"')
        command = "srun --ntasks-per-node=1 sh -c " + shlex.quote(f"exec {command}")
    env = job_env({"RANKSCOPE_TEST_READY": str(ready), "MASTER_PORT": str(port)})
    # submitted from a folder of its own: other tests' jobs start in tests/programs, and a call made in
    # the job's folder must mean this job alone
    job = cluster.sbatch(command, log=log, env=env, cwd=tmp, nodes=nodes)

    def all_ready() -> bool:
        if cluster.state_of(job) not in ("RUNNING", "PENDING", "CONFIGURING"):
            raise RuntimeError(
                f"job {job} ended before its ranks were ready:\n{_read(log)}\n{cluster.logs()}"
            )
        return len(list(ready.iterdir())) >= ranks

    try:
        wait_for(
            all_ready,
            60,
            f"the {ranks} ranks of Slurm job {job} to mark themselves ready",
            0.1,
            lambda: (
                f"marked: {sorted(p.name for p in ready.iterdir())}; state {cluster.state_of(job)!r}; "
                f"its last output:\n{tail(_read(log))}"
            ),
        )
        yield job
    finally:
        cluster.cancel(job)


@pytest.fixture(scope="module")
def hung_job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the hung job is submitted from."""
    return tmp_path_factory.mktemp("slurmjob")


@pytest.fixture(scope="module")
def hung_job(cluster: SlurmCluster, hung_job_dir: Path) -> Iterator[str]:
    """A 3-rank torchrun job under sbatch whose rank 2 calls barrier() while ranks 0-1 all_reduce: a
    majority of two against it."""
    yield from _submit(cluster, hung_job_dir, ["--nproc_per_node=3"], odd=2, ranks=3)


@pytest.fixture(scope="module")
def two_node_job(two_nodes: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """2 nodes x 2 ranks; rank 3 (on node2) calls barrier() while the others all_reduce."""
    launcher = ["--nnodes=2", NODE_RANK, "--nproc_per_node=2"]
    yield from _submit(
        two_nodes, tmp_path_factory.mktemp("slurmjob2"), launcher, odd=3, ranks=4, nodes=2, srun=True
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _rankscope(
    cluster: SlurmCluster, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as a user on a login node runs it: rankscope on PATH, SLURM_CONF set, no allocation."""
    env = {"PATH": f"{BIN}:{cluster.env['PATH']}"}
    return cluster.run(sys.executable, "-m", "rankscope", *args, timeout=60.0, env=env, cwd=cwd)


@pytest.mark.slow
def test_via_srun_names_the_culprit_of_a_hung_sbatch_job(cluster: SlurmCluster, hung_job: str) -> None:
    res = _rankscope(cluster, "stacks", "--via", "srun", "--job", hung_job, "--json", "--window", "0.5")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    verdict = report["verdict"]
    assert verdict["kind"] == "mismatched_collectives", verdict
    assert verdict["suspect_ranks"] == [2]
    assert "hang_collectives.py:53" in json.dumps(verdict)  # the line rank 2 waits at (barrier)
    [node] = cluster.nodes
    assert f"ranks 0-2 on {node}" in " ".join(report["job"]["notes"]), report["job"]
    assert {r["host"] for r in report["job"]["ranks"]} == {node}
    # rankscope's own srun step is not a job of the host, and the Slurm job's ranks were chosen
    text = json.dumps(report)
    assert f"slurm:{hung_job}." not in text and "distributed jobs run on this host" not in text
    assert not report["errors"], report["errors"]


def test_unknown_and_finished_jobs_say_what_to_do(cluster: SlurmCluster, tmp_path: Path) -> None:
    res = _rankscope(cluster, "stacks", "--via", "srun", "--job", "987654", "--brief")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "Slurm does not know job 987654" in res.stderr and "squeue --me" in res.stderr
    job = cluster.sbatch("sleep 600", log=tmp_path / "sleep.log")
    wait_for(lambda: cluster.state_of(job) == "RUNNING", 30, f"job {job} running", 0.1)
    cluster.cancel(job)
    res = _rankscope(cluster, "stacks", "--via", "srun", "--job", job, "--brief")
    assert res.returncode == 2, res.stdout
    assert f"Slurm job {job} is CANCELLED" in res.stderr and "rankscope triage" in res.stderr
    assert str(tmp_path / "sleep.log") in res.stderr


@pytest.mark.slow
def test_plain_call_in_the_jobs_folder_on_a_login_node(
    cluster: SlurmCluster, hung_job: str, hung_job_dir: Path
) -> None:
    """A plain `rankscope stacks` in the folder the job was submitted from means that Slurm job."""
    res = _rankscope(cluster, "stacks", "--brief", "--window", "0.5", cwd=hung_job_dir)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("verdict: mismatched_collectives, confidence high; suspects: rank 2"), (
        res.stdout
    )
    assert "collected via srun" in res.stdout


@pytest.mark.slow
def test_mcp_dump_stacks_via_srun_over_two_nodes(
    two_nodes: SlurmCluster, two_node_job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dump_stacks(via="srun", job=ID) from the login node: each node answers for its own ranks
    (ranks 0-1 on node1, 2-3 on node2), one verdict names rank 3 on node2; and the same errors.
    rankscope is not on the PATH the steps get: they run the server's own interpreter."""
    monkeypatch.setenv("SLURM_CONF", two_nodes.env["SLURM_CONF"])
    path = [d for d in two_nodes.env["PATH"].split(":") if d and not Path(d, "rankscope").exists()]
    monkeypatch.setenv("PATH", ":".join(path))

    async def calls() -> tuple[CallToolResult, CallToolResult]:
        async with Client(build_server()) as client:
            args = {"via": "srun", "job": two_node_job, "window_s": 0.5}
            found = await client.call_tool("dump_stacks", args)
            unknown = await client.call_tool("dump_stacks", {"via": "srun", "job": "987654"})
            return found, unknown

    found, unknown = anyio.run(calls)
    assert not found.is_error, found.content
    report = found.structured_content or {}
    verdict = report["verdict"]
    assert verdict["kind"] == "mismatched_collectives" and verdict["suspect_ranks"] == [3], verdict
    notes = " ".join(report["job"]["notes"])
    assert "ranks 0-1 on node1" in notes and "ranks 2-3 on node2" in notes, report["job"]
    assert not report.get("errors"), report.get("errors")
    assert unknown.is_error
    block = unknown.content[0]
    assert isinstance(block, TextContent) and "Slurm does not know job 987654" in block.text


@pytest.mark.slow
def test_plain_call_inside_the_allocation_collects_every_node(
    two_nodes: SlurmCluster, two_node_job: str
) -> None:
    """On node1, in a step of the job (`srun --overlap`): a plain `rankscope stacks` reaches node2 too."""
    argv = ["srun", f"--jobid={two_node_job}", "--overlap", "-N1", "-n1", "-w", "node1"]
    res = two_nodes.run(
        *argv,
        sys.executable,
        "-m",
        "rankscope",
        "stacks",
        "--brief",
        "--window",
        "0.5",
        timeout=60.0,
        env={"PATH": f"{BIN}:{two_nodes.env['PATH']}"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("verdict: mismatched_collectives, confidence high; suspects: rank 3"), (
        res.stdout
    )
    assert "ranks 0-1 on node1" in res.stdout and "ranks 2-3 on node2" in res.stdout
