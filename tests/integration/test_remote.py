"""Cross-host collection over real sshds on 127.0.0.1: why a host cannot answer, and the fix.

Two sshd instances run on loopback with throwaway keys: on ``good`` the remote
PATH holds rankscope (sshd's ``SetEnv``), on ``bare`` it does not, which is
exactly a node without rankscope on its PATH. Hosts that really are apart, each
seeing only its own ranks, are in tests/integration/test_nodes.py.

The tests here start processes; the pure ones are in tests/unit/test_remote.py.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankscope.capabilities.remote import dump_stacks_remote
from rankscope.options import DumpOptions, StacksTarget
from rankscope.runtime.proctree import reap_tree
from tests.jobs import JobFactory, free_port, wait_for
from tests.live_stacks import run_cli

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


def _fake_rankscope(tmp: Path, sleep: float) -> Path:
    script = tmp / "fake-rankscope"
    script.write_text(f"#!/bin/sh\nsleep {sleep}\necho '{{}}'\n")
    script.chmod(0o755)
    return script


def test_each_host_that_cannot_answer_says_why(sshds: tuple[Sshd, Sshd]) -> None:
    """A port where nothing listens, a user without a key, a node without rankscope on its PATH (the
    collecting rankscope's own path answers there), a rankscope command that does not exist. No
    job is needed: each host is pointed at the sshd's own pid, which is no job, so the answer
    does not depend on the other jobs of this machine. Hosts apart are tests/integration/test_nodes.py."""
    good, bare = sshds
    dead = f"ssh://{USER}@127.0.0.1:{free_port()}"  # nothing listens there
    nobody = good.host("127.0.0.1", user="nobody")  # no key for this user
    no_rankscope = bare.host("localhost")
    not_a_job = int((Path(bare.key).parent / "bare" / "sshd.pid").read_text())
    report = dump_stacks_remote(
        StacksTarget(hosts=(dead, nobody, no_rankscope), via="ssh"),
        DumpOptions(timeout=30, window=0),
        pid=not_a_job,
        ssh_options=good.options(),
    )
    kinds = {e.host: e for e in report.errors if e.rank is None}
    assert kinds[dead].kind == "unreachable" and "ssh -o BatchMode=yes" in kinds[dead].fix
    assert kinds[nobody].kind == "auth_failed" and "ssh-agent" in kinds[nobody].fix
    # not on its PATH: found at the collecting rankscope's path, which answered (no job at that pid)
    assert kinds[no_rankscope].kind == "failed" and "not a Python process" in kinds[no_rankscope].message
    assert any(n.startswith(f"rankscope not on the PATH of {no_rankscope}: ran ") for n in report.job.notes)
    assert any("could not collect from" in e for e in report.verdict.evidence)

    missing = dump_stacks_remote(
        StacksTarget(hosts=(good.host("127.0.0.1"),), rankscope_cmd="/nonexistent/rankscope"),
        DumpOptions(timeout=30, window=0),
        ssh_options=good.options(),
    )
    [err] = missing.errors
    assert err.kind == "not_installed" and "pip install rankscope" in err.fix


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
def test_debug_server_collects_every_rank_without_ssh(
    jobs: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API, given the job's store as a host, and the CLI, finding the store from MASTER_ADDR and
    MASTER_PORT without --hosts, ask the same hung job: both only read it (stack dumps and recorder
    traces over each rank's debug server), and one job is most of what either check costs."""
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
    # the CLI without --hosts: the store's address from the environment a job's shell has
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(job.port))
    code, out, err = run_cli("stacks", "--via", "debug-server", "--timeout", "30", "--json")
    assert code == 0, err
    cli = json.loads(out)
    assert cli["job"]["world_size"] == 2 and cli["errors"] == []
    assert cli["verdict"]["kind"] == "divergent_ranks" and cli["verdict"]["suspect_ranks"] == [1]
