"""Jobs that never started, over two hosts that really are apart, called from a login node.

node1 and node2 (tests/nodes.py) each see only their own processes. Six jobs start at once, each
in its own folder, and none ever runs a collective: torchrun agents launched with another
``--master_port`` on node2; on node1 only (node2 never launched); with another ``--nnodes`` on
node2; on a store port a stray process on node1 already holds; with another ``--rdzv_id`` on node2
(c10d); and ranks started by hand (static rendezvous) with rank 3 never started. Each test makes
the call an agent makes on a login node, in the job's folder, and reads that the answer names the
node or rank missing and the setting that differs.

The jobs start once for the module (agents importing torch take a while on two cores); each test
only reads them.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rankscope.runtime import procfs
from tests.jobs import PROGRAMS, free_port, wait_for
from tests.nodes import Nodes

pytestmark = pytest.mark.slow

TOOLS = Path(__file__).resolve().parents[2] / "tools"
PROGRAM = PROGRAMS / "startup_wait.py"
BASE_ENV = {
    "OMP_NUM_THREADS": "1",
    "GLOO_SOCKET_IFNAME": "lo",
    "PYTHONUNBUFFERED": "1",
    "PYTHONPATH": str(PROGRAMS),
}


@dataclass
class Case:
    """One job: its folder, its store port, and the agents to wait for (host -> count)."""

    folder: Path
    port: int
    agents: dict[str, int] = field(default_factory=dict)
    ranks: int = 0
    listens: bool = True
    log_says: str = ""
    """Words the case's shared log must hold before the case is ready (a launcher's exit)."""


def _torchrun(nodes: Nodes, case: Case, host: str, *args: str, log: Path | None = None) -> None:
    argv = [sys.executable, "-m", "torch.distributed.run", *args, "--monitor_interval=0.2", str(PROGRAM)]
    nodes.start(host, case.folder, [*argv, str(case.folder)], BASE_ENV, log=log)
    case.agents[host] = case.agents.get(host, 0) + 1


def _static(case: Case, node_rank: int, *, port: int | None = None, nnodes: int = 2) -> list[str]:
    return [
        f"--nnodes={nnodes}", f"--node_rank={node_rank}", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={port or case.port}",
    ]  # fmt: skip


def _case(root: Path, name: str, **kw: Any) -> Case:
    folder = root / name
    (folder / "ready").mkdir(parents=True)
    return Case(folder=folder, port=free_port(), **kw)


def _agents_up(case: Case) -> bool:
    """Every agent of the case has torch loaded (it then waits in rendezvous) and, where one
    should, something listens at the store's port: read from this machine, which sees every node."""
    found = 0
    for pid in procfs.pids():
        argv = procfs.read_cmdline(pid)
        if "torch.distributed.run" in argv and str(case.folder) in argv:
            found += procfs.maps_mention(pid, (b"libtorch",))
    listening = any(s.listening for s in procfs.tcp_sockets(frozenset({case.port})))
    ranks = len(list((case.folder / "ready").iterdir()))
    said = case.log_says in _read(case.folder / "job.log").lower() if case.log_says else True
    return (
        found >= sum(case.agents.values())
        and (listening or not case.listens)
        and ranks >= case.ranks
        and said
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@pytest.fixture(scope="module")
def cases(nodes: Nodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Case]]:
    root = tmp_path_factory.mktemp("startup")
    # rankscope on every node's PATH and the login node's: this checkout's, whatever the venv points to
    wrapper = nodes.bin / "rankscope"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(TOOLS))} exec {shlex.quote(sys.executable)} -m rankscope "$@"\n'
    )
    wrapper.chmod(0o755)
    made = {n: _case(root, n) for n in ("port", "never", "nnodes", "held", "rdzv_id", "static")}
    port, never, nnodes, held, rdzv, static = made.values()
    _torchrun(nodes, port, "node1", *_static(port, 0))
    _torchrun(nodes, port, "node2", *_static(port, 1, port=free_port()))
    _torchrun(nodes, never, "node1", *_static(never, 0))
    _torchrun(nodes, nnodes, "node1", *_static(nnodes, 0, nnodes=3))
    _torchrun(nodes, nnodes, "node2", *_static(nnodes, 1))
    holder = f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0', {held.port})); s.listen(); time.sleep(3600)"
    nodes.start("node1", held.folder, [sys.executable, "-c", holder], {})
    wait_for(lambda: _agents_up(Case(held.folder, held.port)), 60, "the stray process on the store's port")
    shared = held.folder / "job.log"  # one log for both nodes, as a batch job's
    _torchrun(nodes, held, "node1", *_static(held, 0), log=shared)
    _torchrun(nodes, held, "node2", *_static(held, 1), log=shared)
    held.agents = {"node2": 1}  # node1's cannot listen: it exits, and says so in the log
    held.log_says = "in use"
    c10d = [
        "--nnodes=2",
        "--nproc_per_node=2",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{rdzv.port}",
    ]
    _torchrun(nodes, rdzv, "node1", *c10d, "--rdzv_id=today")
    _torchrun(nodes, rdzv, "node2", *c10d, "--rdzv_id=yesterday")
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2")):  # rank 3 is never started
        env = {**BASE_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(static.port),
               "RANKSCOPE_TEST_READY": str(static.folder / "ready")}  # fmt: skip
        nodes.start(host, static.folder, [sys.executable, str(PROGRAM)], env)
    static.ranks = 3
    for name, case in made.items():
        try:
            wait_for(lambda case=case: _agents_up(case), 180, f"the {name} job's launchers", interval=0.2)
        except TimeoutError:
            logs = {p.name: p.read_text(errors="replace")[-1500:] for p in case.folder.glob("node*.log")}
            raise TimeoutError(f"{name}: not up: {logs}") from None
    yield made


def _login(nodes: Nodes, case: Case, *args: str) -> str:
    res = nodes.login([str(nodes.bin / "rankscope"), *args], case.folder, timeout=180)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _stacks(nodes: Nodes, case: Case) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(_login(nodes, case, "stacks", "--hosts", "node1,node2", "--json"))
    assert report["verdict"]["kind"] == "startup", report["verdict"]
    return report


def test_the_node_given_another_master_port(nodes: Nodes, cases: dict[str, Case]) -> None:
    """The issue's own incident: the brief answer leads with the node and the argument, and `ps`
    on each node lists the job waiting in rendezvous."""
    case = cases["port"]
    brief = _login(nodes, case, "stacks", "--hosts", "node1,node2", "--brief")
    assert brief.startswith("verdict: startup, confidence high\n"), brief
    assert (
        "node2 was launched with --master_port=" in brief and f"node1 with --master_port={case.port}" in brief
    )
    assert f"Relaunch node2 with --master_port={case.port}" in brief
    ps = nodes.ssh("node2", f"cd {shlex.quote(str(case.folder))} && rankscope ps")
    assert "starting: rendezvous" in ps.stdout and "no rank started yet" in ps.stdout, ps


def test_a_node_never_launched(nodes: Nodes, cases: dict[str, Case]) -> None:
    verdict = _stacks(nodes, cases["never"])["verdict"]
    assert "1 of 2 nodes joined (node1); node2 (node_rank 1) runs no launcher" in verdict["summary"], verdict
    assert (
        "Launch the job on node2 with the same command (--node_rank=1)" in verdict["next_steps"][0]["action"]
    )


def test_nnodes_differs(nodes: Nodes, cases: dict[str, Case]) -> None:
    verdict = _stacks(nodes, cases["nnodes"])["verdict"]
    assert "disagree on --nnodes (node1 --nnodes=3, node2 --nnodes=2)" in verdict["summary"], verdict


def test_the_store_port_held_by_another_process(nodes: Nodes, cases: dict[str, Case]) -> None:
    case = cases["held"]
    verdict = _stacks(nodes, case)["verdict"]
    assert f"the store's port {case.port} on node1 is held by pid " in verdict["summary"], verdict
    assert "no launcher or rank of this job" in verdict["summary"]
    assert "node1 runs no launcher of the job" in verdict["summary"]
    said = [e for e in verdict["evidence"] if e.startswith(f"log: {case.folder / 'job.log'}: ")]
    assert said and "in use" in said[0].lower(), verdict["evidence"]  # node1's launcher said why it left


def test_rdzv_id_differs(nodes: Nodes, cases: dict[str, Case]) -> None:
    verdict = _stacks(nodes, cases["rdzv_id"])["verdict"]
    assert "--rdzv_id (node1 --rdzv_id=today, node2 --rdzv_id=yesterday)" in verdict["summary"], verdict


def test_static_rendezvous_one_rank_never_started(nodes: Nodes, cases: dict[str, Case]) -> None:
    report = _stacks(nodes, cases["static"])
    verdict = report["verdict"]
    assert verdict["summary"].startswith("starting: init: ranks 0-2 wait in init_process_group for rank 3"), (
        verdict
    )
    assert "no process of it on node1, node2" in verdict["summary"]
    assert verdict["suspect_ranks"] == [3] and verdict["confidence"] == "high"
    assert any(n.startswith("node1: starting: init: rank 0 ") for n in report["job"]["notes"])


def test_from_the_jobs_own_host(nodes: Nodes, cases: dict[str, Case]) -> None:
    """On node1 alone: how many nodes are missing, and the call that names them."""
    case = cases["never"]
    res = nodes.ssh("node1", f"cd {shlex.quote(str(case.folder))} && rankscope stacks --brief", timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("verdict: startup, confidence medium\n"), res.stdout
    assert f"wait in rendezvous at 127.0.0.1:{case.port} for 1 more node(s) (node_rank 1)" in res.stdout
    assert "--hosts" in res.stdout
