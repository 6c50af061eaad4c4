"""One job over two hosts that really are apart, called from a login node.

node1 and node2 (tests/nodes.py) each see only their own ranks and are reached only by ssh; the
call is made from a login namespace that sees no rank at all, in a job's folder, as an agent on a
cluster's login node makes it. Two 4-rank jobs run over both nodes (ranks 0-1 on node1, 2-3 on
node2): job A, a DDP loop whose rank 3 takes a guarded ``continue`` past the gradient all-reduce
(tests/programs/hang_ddp.py), and job B, whose rank 0 waits in a checkpoint's barrier under
``if rank == 0:`` (tests/programs/checkpoint_rank0.py). The last test adds a third job for itself
alone, one rank per node, whose rank 1 on node2 waits on a DataLoader worker stuck on a FIFO.

Slow: the jobs take about 15 s to start on two cores, so they start once for the module and every
test only reads them (each call takes a few seconds).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.jobs import PROGRAMS, wait_for
from tests.nodes import Nodes, job_progress, torchrun_on_nodes

RANKSCOPE = Path(sys.executable).parent / "rankscope"

pytestmark = pytest.mark.slow


@dataclass
class TwoJobs:
    root: Path
    a: Path
    b: Path
    b_id: str


@pytest.fixture(scope="module")
def two_jobs(nodes: Nodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoJobs]:
    root = tmp_path_factory.mktemp("cluster")
    a, b = root / "job-a", root / "job-b"
    for folder in (a, b):
        (folder / "ready").mkdir(parents=True)
    torchrun_on_nodes(nodes, a, PROGRAMS / "hang_ddp.py", ["--odd", "3"], nproc=2, ready=a / "ready")
    port_b = torchrun_on_nodes(nodes, b, PROGRAMS / "checkpoint_rank0.py", [], nproc=2, ready=b / "ready")

    def ready() -> bool:
        return all(len(list((f / "ready").iterdir())) == 4 for f in (a, b))

    wait_for(
        ready,
        180,
        "both jobs' 4 ranks on node1 and node2 to mark themselves ready",
        0.2,
        lambda: job_progress(a, b),
    )
    yield TwoJobs(root=root, a=a, b=b, b_id=f"torchrun:127.0.0.1:{port_b}")


@pytest.fixture(params=["on the nodes' PATH", "only at the caller's path"])
def on_path(request: pytest.FixtureRequest, nodes: Nodes) -> Iterator[bool]:
    """rankscope on the nodes' PATH for one test, or only where the collecting rankscope is."""
    link = nodes.bin / "rankscope"
    if request.param == "on the nodes' PATH":
        link.symlink_to(RANKSCOPE)
    try:
        yield link.exists()
    finally:
        link.unlink(missing_ok=True)


def _which_rankscope(report: dict[str, Any], on_path: bool) -> None:
    notes = [n for n in report["job"]["notes"] if "not on the PATH" in n]
    assert notes == ([] if on_path else [f"rankscope not on the PATH of node1, node2: ran {RANKSCOPE}"])


def _stacks(nodes: Nodes, cwd: Path, *args: str) -> dict[str, Any]:
    res = nodes.login([str(RANKSCOPE), "stacks", "--hosts", "node1,node2", "--json", "--full", *args], cwd)
    assert res.returncode == 0, res.stderr
    report: dict[str, Any] = json.loads(res.stdout)
    return report


def _hosts(report: dict[str, Any]) -> dict[int, str]:
    return {r["rank"]: r["host"] for r in report["job"]["ranks"]}


def _said(report: dict[str, Any]) -> str:
    verdict = report["verdict"]
    return " ".join([verdict["summary"], *(s["action"] for s in verdict["next_steps"])])


def test_the_job_of_the_folder_on_every_host(nodes: Nodes, two_jobs: TwoJobs, on_path: bool) -> None:
    """What an agent on the login node reads (``--brief``): the verdict first, the ranks host by
    host, and the loop rank 3 left with the guarded continue that sent it out, read across hosts."""
    res = nodes.login([str(RANKSCOPE), "stacks", "--hosts", "node1,node2", "--brief"], two_jobs.a)
    assert res.returncode == 0, res.stderr
    brief = res.stdout
    assert brief.startswith("verdict: mismatched_collectives, confidence high; suspects: rank 3\n")
    assert "ranks 0-1 on node1 (pids " in brief and "; ranks 2-3 on node2 (pids " in brief
    assert "`for step in range(a.steps)`" in brief
    assert "`last and rank == a.odd` (hang_ddp.py:30)" in brief
    assert "take the `continue` at hang_ddp.py:31" in brief
    assert ("not on the PATH" not in brief) == on_path
    if not on_path:
        assert f"rankscope not on the PATH of node1, node2: ran {RANKSCOPE}" in brief


def test_another_job_by_id(nodes: Nodes, two_jobs: TwoJobs, on_path: bool) -> None:
    report = _stacks(nodes, two_jobs.a, "--job", two_jobs.b_id)
    assert report["job"]["job_id"] == two_jobs.b_id
    assert _hosts(report) == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert report["verdict"]["suspect_ranks"] == [0]
    assert "`if rank == 0:`" in _said(report)  # the rank-0-only guard, quoted as on one host
    _which_rankscope(report, on_path)


def test_several_jobs_and_no_choice_are_listed_once(nodes: Nodes, two_jobs: TwoJobs) -> None:
    res = nodes.login([str(RANKSCOPE), "stacks", "--hosts", "node1,node2", "--brief"], two_jobs.root)
    assert res.returncode == 2
    [line] = [ln for ln in res.stderr.splitlines() if "distributed jobs run on" in ln]
    assert "2 distributed jobs run on node1, node2" in line
    for folder in (two_jobs.a, two_jobs.b):
        assert line.count(f"started in {folder})") == 1
    assert line.count("ranks 0-1 on node1, 2-3 on node2") == 2
    assert "--job" in res.stderr


def test_a_launcher_pid_on_another_host_picks_its_job_everywhere(nodes: Nodes, two_jobs: TwoJobs) -> None:
    found = nodes.ssh("node2", "pgrep -f '[t]orch.distributed.run.*checkpoint_rank0'")
    [pid] = found.stdout.split()
    report = _stacks(nodes, two_jobs.a, "--pid", f"node2:{pid}")
    assert report["job"]["job_id"] == two_jobs.b_id
    assert _hosts(report) == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert report["verdict"]["suspect_ranks"] == [0]


MCP_CALL = """\
import json, sys
import anyio
from mcp import Client
from rankscope.mcp_server import build_server

async def main():
    async with Client(build_server()) as client:
        args = {"pid": sys.argv[1], "hosts": ["node1"], "window_s": 0.5, "full": True}
        result = await client.call_tool("dump_stacks", args)
        print(json.dumps(result.structured_content))

anyio.run(main)
"""


def test_mcp_pid_on_another_host_picks_its_job_everywhere(nodes: Nodes, two_jobs: TwoJobs) -> None:
    """dump_stacks(pid="node2:PID", hosts=["node1"]) over MCP from the login node: the pid's host
    joins the hosts, and its job is the one inspected on both."""
    found = nodes.ssh("node2", "pgrep -f '[t]orch.distributed.run.*checkpoint_rank0'")
    [pid] = found.stdout.split()
    res = nodes.login([sys.executable, "-c", MCP_CALL, f"node2:{pid}"], two_jobs.a)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["job"]["job_id"] == two_jobs.b_id
    assert _hosts(report) == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert report["verdict"]["suspect_ranks"] == [0]


def test_rankscope_from_the_jobs_interpreter_when_the_callers_path_is_not_there(
    nodes: Nodes, two_jobs: TwoJobs
) -> None:
    """The collecting rankscope runs from a folder only the login node has (a tmpfs of its own),
    and no node has rankscope on its PATH: each node runs a rank's interpreter with -m rankscope."""
    private = nodes.state / "login-only"
    private.mkdir(exist_ok=True)
    setup = 'mount -t tmpfs none "$1" && cp "$2" "$1/rankscope" && shift 2 && exec "$@"'
    argv = ["sh", "-c", setup, "login", str(private), str(RANKSCOPE), str(private / "rankscope")]
    res = nodes.login(
        [*argv, "stacks", "--hosts", "node1,node2", "--json", "--full", "--job", two_jobs.b_id], two_jobs.a
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert _hosts(report) == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert report["verdict"]["suspect_ranks"] == [0]
    assert (
        f"rankscope not on the PATH of node1, node2: ran {sys.executable} -m rankscope"
        in report["job"]["notes"]
    )


@pytest.fixture
def loader_job(nodes: Nodes, two_jobs: TwoJobs) -> Iterator[Path]:
    """A third job over both nodes, for one test (the others count two jobs): rank 0 on node1
    all-reduces while rank 1, on node2, waits in its DataLoader, whose worker opens a shard that is
    a FIFO with no writer. One rank per node: a rank in no collective is named without a majority
    of peers. Stopped at the end by its launchers' process groups on each node."""
    folder = two_jobs.root / "job-c"
    shards = folder / "shards"
    (folder / "ready").mkdir(parents=True)
    shards.mkdir()
    (shards / "shard0").write_bytes(b"abcd")
    os.mkfifo(shards / "shard1")
    args = ["--shards", str(shards), "--odd", "1"]
    torchrun_on_nodes(nodes, folder, PROGRAMS / "hang_loader_fifo.py", args, nproc=1, ready=folder / "ready")
    try:
        wait_for(
            lambda: len(list((folder / "ready").iterdir())) == 1,
            180,
            "rank 0 of the loader job to mark itself ready",
            detail=lambda: job_progress(folder),
        )
        yield folder
    finally:
        for host in nodes.names:  # each launcher leads its own session (setsid): its group is the job
            nodes.ssh(
                host,
                "for p in $(pgrep -f '[t]orch.distributed.run.*hang_loader_fifo'); do kill -KILL -- -$p; done",
            )


def test_a_rank_on_another_host_is_followed_into_its_dataloader_worker(
    nodes: Nodes, loader_job: Path
) -> None:
    """node2's own call dumps the worker of the rank that waits on it; the verdict, made on the
    login node, names rank 1 and quotes that worker's line and the FIFO it waits on."""
    report = _stacks(nodes, loader_job)
    v = report["verdict"]
    assert v["suspect_ranks"] == [1] and _hosts(report)[1] == "node2"
    assert "rank 1's DataLoader worker (pid " in v["summary"], v["summary"]
    assert "in ShardDataset.__getitem__ (`with open(self.path" in v["summary"]
    assert "a FIFO (named pipe)" in v["summary"] and str(loader_job / "shards" / "shard1") in v["summary"]
    assert v["next_steps"][0]["action"].startswith(
        "Fix what the worker (or thread) the evidence names waits on"
    )
