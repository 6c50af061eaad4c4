"""Cross-host collection: a real sshd on 127.0.0.1, a gloo job over two "nodes", and command syntax.

Two sshd instances run on loopback with throwaway keys: on ``good`` the remote
PATH holds rankscope (sshd's ``SetEnv``), on ``bare`` it does not, which is
exactly a node without rankscope. The two nodes of the job are addressed as
127.0.0.1 and localhost; each remote call is pointed at its own node's
torchrun pid so it sees only that node's ranks.

The tests here start processes; the pure ones are in tests/unit/test_remote.py.
"""

from __future__ import annotations

import contextlib
import getpass
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankscope import api
from rankscope.capabilities.remote import dump_stacks_remote
from rankscope.options import DumpOptions, StacksTarget
from rankscope.runtime.proctree import reap_tree
from tests.jobs import JobFactory, RunningJob, free_port, wait_for

BIN = Path(sys.executable).parent

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"

USER = getpass.getuser()


@dataclass
class Sshd:
    port: int
    key: Path

    def options(self) -> list[str]:
        return [
            "-F",
            "/dev/null",
            "-i",
            str(self.key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
        ]

    def host(self, name: str, user: str | None = None) -> str:
        return f"ssh://{user or USER}@{name}:{self.port}"


def _start_sshd(
    tmp: Path, name: str, user_key: Path, path_env: str | None
) -> tuple[subprocess.Popen[bytes], Sshd]:
    d = tmp / name
    d.mkdir()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True, timeout=30
    )
    (d / f"authorized_keys_{USER}").write_text(Path(f"{user_key}.pub").read_text())
    port = free_port()
    lines = [
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {d / 'host_key'}",
        f"AuthorizedKeysFile {d}/authorized_keys_%u",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "UsePAM no",
        f"PidFile {d / 'sshd.pid'}",
    ]
    if path_env:
        lines.append(f"SetEnv PATH={path_env}")
    (d / "sshd_config").write_text("\n".join(lines) + "\n")
    with contextlib.suppress(PermissionError):
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory (root's sshd)
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
        stdout=subprocess.DEVNULL,
        stderr=open(d / "sshd.log", "wb"),
        start_new_session=True,
    )

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(d / 'sshd.log').read_text()}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, 30, f"sshd on port {port}")
    return proc, Sshd(port=port, key=user_key)


@pytest.fixture(scope="module")
def sshds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sshd, Sshd]]:
    """(good, bare): rankscope on the remote PATH, and not."""
    assert Path(SSHD).exists(), "sshd missing: apt-get install -y openssh-server"
    tmp = tmp_path_factory.mktemp("sshd")
    key = tmp / "user_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    procs = []
    try:
        good_proc, good = _start_sshd(tmp, "good", key, f"{BIN}:/usr/local/bin:/usr/bin:/bin")
        procs.append(good_proc)
        bare_proc, bare = _start_sshd(tmp, "bare", key, "/usr/bin:/bin")
        procs.append(bare_proc)
        yield good, bare
    finally:
        for p in procs:
            reap_tree(p, grace=2.0)


def _node(jobs: JobFactory, node_rank: int, port: int) -> RunningJob:
    return jobs.torchrun_node("two_node.py", node_rank, 2, port)


@pytest.fixture
def two_nodes(jobs: JobFactory) -> tuple[RunningJob, RunningJob]:
    port = free_port()
    node0, node1 = _node(jobs, 0, port), _node(jobs, 1, port)
    node0.wait_ready(["rank0", "rank1"], timeout=90)
    node1.wait_ready(["rank2", "rank3"], timeout=90)
    return node0, node1


def _fake_rankscope(tmp: Path, sleep: float) -> Path:
    script = tmp / "fake-rankscope"
    script.write_text(f"#!/bin/sh\nsleep {sleep}\necho '{{}}'\n")
    script.chmod(0o755)
    return script


@pytest.mark.slow
def test_two_nodes_over_ssh_name_the_culprit_on_the_other_node(
    sshds: tuple[Sshd, Sshd], two_nodes: tuple[RunningJob, RunningJob], pyspy_works: str
) -> None:
    good, bare = sshds
    node0, node1 = two_nodes
    h0, h1 = good.host("127.0.0.1"), good.host("localhost")
    dead = f"ssh://{USER}@127.0.0.1:{free_port()}"  # nothing listens there
    nobody = good.host("127.0.0.1", user="nobody")  # no key for this user
    no_rankscope = bare.host("localhost")

    # Both agents run on this one machine: the pid of node 0's agent selects the whole job.
    alone = api.dump_stacks_remote(
        StacksTarget(hosts=(h0,)), DumpOptions(timeout=60), pids={h0: node0.pid}, ssh_options=good.options()
    )
    assert sorted(r.rank for r in alone.job.ranks) == [0, 1, 2, 3]
    assert alone.job.missing_ranks == []
    assert alone.verdict.suspect_ranks == [3]

    report = dump_stacks_remote(
        StacksTarget(hosts=(h0, h1, dead, nobody, no_rankscope), via="ssh", rankscope_cmd="rankscope"),
        DumpOptions(timeout=60),
        pids={h0: node0.pid, h1: node1.pid, no_rankscope: node1.pid},
        ssh_options=good.options(),
    )

    assert report.job.world_size == 4
    assert sorted(r.rank for r in report.job.ranks if r.rank is not None) == [0, 1, 2, 3]
    hosts = {r.rank: r.host for r in report.job.ranks}
    assert hosts == {0: h0, 1: h0, 2: h0, 3: h0}  # both "hosts" are this machine: the first report is kept
    assert report.job.missing_ranks == []
    assert report.verdict.kind == "divergent_ranks", report.verdict
    assert report.verdict.suspect_ranks == [3]
    culprit = next(s for s in report.stacks if s.rank == 3)
    assert culprit.host == h0 and culprit.call_site is not None and culprit.call_site.function == "load_batch"

    kinds = {e.host: e for e in report.errors if e.rank is None}
    assert kinds[dead].kind == "unreachable" and "ssh -o BatchMode=yes" in kinds[dead].fix
    assert kinds[nobody].kind == "auth_failed" and "ssh-agent" in kinds[nobody].fix
    assert no_rankscope not in kinds  # not on its PATH: the collecting rankscope's own path answered
    assert any(n.startswith(f"rankscope not on the PATH of {no_rankscope}: ran ") for n in report.job.notes)
    assert any("could not collect from" in e for e in report.verdict.evidence)


def test_timeout_is_reported_and_reaped(tmp_path: Path) -> None:
    fake = _fake_rankscope(tmp_path, 30)
    t0 = time.monotonic()
    report = dump_stacks_remote(
        StacksTarget(hosts=("slow-node",), via="local", rankscope_cmd=str(fake)), DumpOptions(timeout=1.0)
    )
    assert time.monotonic() - t0 < 20  # bounded by the timeout, not by the 30 s sleep
    [err] = report.errors
    assert err.kind == "timeout" and err.host == "slow-node" and "--timeout" in err.fix
    assert report.verdict.kind == "inconclusive" or report.job.ranks == []
    out = subprocess.run(["pgrep", "-f", str(fake)], capture_output=True, text=True, timeout=10)
    assert out.stdout.strip() == "", "the timed-out command must be reaped"


@pytest.mark.slow
def test_debug_server_collects_every_rank_without_ssh(jobs: JobFactory) -> None:
    job = jobs.torchrun("debug_server_hang.py", nproc=2, args=[str(free_port())])
    job.wait_ready(["rank0", "rank1"], timeout=90)
    report = dump_stacks_remote(
        StacksTarget(hosts=(f"127.0.0.1:{job.port}",), via="debug-server"), DumpOptions(timeout=30)
    )
    assert report.job.world_size == 2 and report.errors == []
    assert report.verdict.kind == "divergent_ranks", report.verdict
    assert report.verdict.suspect_ranks == [1]
    culprit = next(s for s in report.stacks if s.rank == 1)
    assert culprit.call_site is not None and culprit.call_site.function == "wait_for_data"
    # the ranks' flight recorders, fetched over the same servers, agree
    assert any(
        "flight recorder (divergent_ranks): rank 1 never entered gloo:all_reduce #2" in e
        for e in report.verdict.evidence
    )
