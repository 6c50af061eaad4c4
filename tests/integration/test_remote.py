"""Cross-host collection: a real sshd on 127.0.0.1, a gloo job over two "nodes", and command syntax.

Two sshd instances run on loopback with throwaway keys: on ``good`` the remote
PATH holds rankscope (sshd's ``SetEnv``), on ``bare`` it does not, which is
exactly a node without rankscope. The two nodes of the job are addressed as
127.0.0.1 and localhost; each remote call is pointed at its own node's
torchrun pid so it sees only that node's ranks.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
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
from rankscope.errors import InvalidInput
from rankscope.models.core import Job, RankProcess, RankStack, StacksReport, Verdict
from rankscope.proctree import reap_tree
from rankscope.remote import (
    classify_failure,
    dump_stacks_remote,
    expand_hostlist,
    hosts_from_environment,
    kubectl_exec_argv,
    kubectl_get_pods_argv,
    merge_reports,
    parse_faulthandler,
    parse_report,
    pods_from_json,
    split_labelled,
    srun_argv,
    ssh_argv,
    stacks_argv,
)
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

    # What node 0 sees alone: half the world, and no culprit among its own ranks.
    alone = api.dump_stacks_remote([h0], pids={h0: node0.pid}, ssh_options=good.options(), timeout=60)
    assert sorted(r.rank for r in alone.job.ranks) == [0, 1]
    assert alone.job.missing_ranks == [2, 3]
    assert 3 not in alone.verdict.suspect_ranks or alone.verdict.kind == "missing_ranks"

    report = dump_stacks_remote(
        [h0, h1, dead, nobody, no_rankscope],
        via="ssh",
        pids={h0: node0.pid, h1: node1.pid, no_rankscope: node1.pid},
        rankscope_cmd="rankscope",
        ssh_options=good.options(),
        timeout=60,
    )

    assert report.job.world_size == 4
    assert sorted(r.rank for r in report.job.ranks if r.rank is not None) == [0, 1, 2, 3]
    hosts = {r.rank: r.host for r in report.job.ranks}
    assert hosts == {0: h0, 1: h0, 2: h1, 3: h1}
    assert report.job.missing_ranks == []
    assert report.verdict.kind == "divergent_ranks", report.verdict
    assert report.verdict.suspect_ranks == [3]
    culprit = next(s for s in report.stacks if s.rank == 3)
    assert culprit.host == h1 and culprit.call_site is not None and culprit.call_site.function == "load_batch"

    kinds = {e.host: e for e in report.errors if e.rank is None}
    assert kinds[dead].kind == "unreachable" and "ssh -o BatchMode=yes" in kinds[dead].fix
    assert kinds[nobody].kind == "auth_failed" and "ssh-agent" in kinds[nobody].fix
    assert kinds[no_rankscope].kind == "not_installed" and "pip install rankscope" in kinds[no_rankscope].fix
    assert any("could not collect from" in e for e in report.verdict.evidence)


def _fake_rankscope(tmp: Path, sleep: float) -> Path:
    script = tmp / "fake-rankscope"
    script.write_text(f"#!/bin/sh\nsleep {sleep}\necho '{{}}'\n")
    script.chmod(0o755)
    return script


def test_timeout_is_reported_and_reaped(tmp_path: Path) -> None:
    fake = _fake_rankscope(tmp_path, 30)
    t0 = time.monotonic()
    report = dump_stacks_remote(["slow-node"], via="local", rankscope_cmd=str(fake), timeout=1.0)
    assert time.monotonic() - t0 < 20  # bounded by the timeout, not by the 30 s sleep
    [err] = report.errors
    assert err.kind == "timeout" and err.host == "slow-node" and "--timeout" in err.fix
    assert report.verdict.kind == "inconclusive" or report.job.ranks == []
    out = subprocess.run(["pgrep", "-f", str(fake)], capture_output=True, text=True, timeout=10)
    assert out.stdout.strip() == "", "the timed-out command must be reaped"


# ----------------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("node[01-04,07],gpu-a[1-2]", ["node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("single", ["single"]),
        ("a,b,a", ["a", "b"]),
        ("gpu[3]", ["gpu3"]),
    ],
)
def test_expand_hostlist(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("bad", ["node[01-04", "node01-04]", "node[a-b]", "node[5-2]"])
def test_expand_hostlist_rejects_bad_input(bad: str) -> None:
    with pytest.raises(InvalidInput):
        expand_hostlist(bad)


def test_hosts_from_slurm_environment() -> None:
    assert hosts_from_environment({"SLURM_JOB_NODELIST": "gpu[001-002]"}) == ["gpu001", "gpu002"]
    with pytest.raises(InvalidInput) as exc:
        hosts_from_environment({})
    assert "--hosts" in exc.value.fix


def test_command_construction_follows_documented_syntax() -> None:
    remote = stacks_argv("/opt/venv/bin/rankscope", pid=42, native=True, timeout=30)
    assert remote == [
        "/opt/venv/bin/rankscope",
        "stacks",
        "--local",
        "--json",
        "--pid",
        "42",
        "--native",
        "--timeout",
        "24",
    ]
    assert stacks_argv("python -m rankscope")[:4] == ["python", "-m", "rankscope", "stacks"]

    ssh = ssh_argv("node1", remote, timeout=30, ssh_options=["-p", "2222"])
    assert ssh[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    assert ssh[5:] == [
        "-p",
        "2222",
        "node1",
        "--",
        "/opt/venv/bin/rankscope stacks --local --json --pid 42 --native --timeout 24",
    ]

    # srun(1): --overlap (share the step's resources), --jobid, -N/--nodes, --ntasks-per-node, --nodelist, --label
    srun = srun_argv("1234", ["n1", "n2"], ["rankscope", "stacks", "--local", "--json"])
    assert srun == [
        "srun",
        "--overlap",
        "--jobid=1234",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=n1,n2",
        "--label",
        "--kill-on-bad-exit=0",
        "rankscope",
        "stacks",
        "--local",
        "--json",
    ]
    # kubectl exec [-n NS] POD [-c CONTAINER] -- COMMAND [args...]
    assert kubectl_exec_argv("job-0", ["rankscope", "stacks"], "ml", "trainer") == [
        "kubectl",
        "exec",
        "-n",
        "ml",
        "job-0",
        "-c",
        "trainer",
        "--",
        "rankscope",
        "stacks",
    ]
    assert kubectl_get_pods_argv("bert", "ml") == [
        "kubectl",
        "get",
        "pods",
        "-n",
        "ml",
        "-l",
        "job-name=bert",
        "-o",
        "json",
    ]
    assert kubectl_get_pods_argv("app=bert", None)[-3] == "app=bert"


def test_pods_from_kubectl_json() -> None:
    doc = {
        "items": [
            {"metadata": {"name": "bert-1"}, "status": {"phase": "Running"}},
            {"metadata": {"name": "bert-0"}, "status": {"phase": "Running"}},
            {"metadata": {"name": "bert-old"}, "status": {"phase": "Succeeded"}},
        ]
    }
    assert pods_from_json(json.dumps(doc)) == ["bert-0", "bert-1"]
    with pytest.raises(InvalidInput):
        pods_from_json("error: the server doesn't have a resource type")


def test_split_srun_labelled_output() -> None:
    text = ' 0: {\n 1: {\n 0:   "a": 1\n 1:   "b": 2\n 0: }\n 1: }\nsrun: warning\n'
    assert split_labelled(text) == {0: '{\n  "a": 1\n}', 1: '{\n  "b": 2\n}'}


@pytest.mark.parametrize(
    ("rc", "stderr", "kind"),
    [
        (255, "root@n1: Permission denied (publickey).", "auth_failed"),
        (255, "ssh: connect to host n1 port 22: Connection refused", "unreachable"),
        (255, "ssh: Could not resolve hostname n1: Name or service not known", "unreachable"),
        (127, "bash: line 1: rankscope: command not found", "not_installed"),
        (
            1,
            'OCI runtime exec failed: exec: "rankscope": executable file not found in $PATH',
            "not_installed",
        ),
        (2, "rankscope stacks: error: No distributed job found\nFix: run it where the job runs", "failed"),
    ],
)
def test_classify_failure(rc: int, stderr: str, kind: str) -> None:
    err = classify_failure("n1", "ssh", rc, stderr, timed_out=False, timeout=30)
    assert err.kind == kind and err.host == "n1" and err.fix
    if kind == "failed":
        assert err.fix == "run it where the job runs"


def _report(host: str, ranks: list[int], world: int, op: str | None = "all_reduce") -> StacksReport:
    procs = [RankProcess(rank=r, pid=1000 + r, host=host) for r in ranks]
    return StacksReport(
        job=Job(job_id="j1", world_size=world, ranks=procs, hosts=[host]),
        verdict=Verdict(kind="inconclusive", summary="x"),
        stacks=[RankStack(rank=r, pid=1000 + r, host=host, op=op) for r in ranks],
    )


def test_merge_reports_and_parse() -> None:
    a, b = _report("nodeA", [0, 1], 4), _report("nodeB", [2, 3], 4)
    job, stacks, errors, notes = merge_reports({"a": a, "b": b}, [], ["a", "b"])
    assert job.world_size == 4 and [r.host for r in job.ranks] == ["a", "a", "b", "b"]
    assert [s.rank for s in stacks] == [0, 1, 2, 3] and errors == []
    assert "a answered as nodeA" in notes
    dup = _report("nodeC", [1], 4)
    job2, _, _, notes2 = merge_reports({"a": a, "c": dup}, [], ["a", "c"])
    assert [r.rank for r in job2.ranks] == [0, 1] and any("reported by both" in n for n in notes2)
    assert isinstance(parse_report("a", "warning: x\n" + a.model_dump_json()), StacksReport)
    bad = parse_report("a", "no json here")
    assert not isinstance(bad, StacksReport) and bad.kind == "failed"


def test_bad_arguments() -> None:
    with pytest.raises(InvalidInput):
        dump_stacks_remote(["n1"], timeout=0)
    with pytest.raises(InvalidInput):
        dump_stacks_remote(["n1"], via="carrier-pigeon")  # type: ignore[arg-type]
    env = dict(os.environ)
    env.pop("SLURM_JOB_NODELIST", None)
    with pytest.raises(InvalidInput):
        dump_stacks_remote(None, via="kubectl")


# ----------------------------------------------------------------------------- PyTorch's debug server


@pytest.mark.slow
def test_debug_server_collects_every_rank_without_ssh(jobs: JobFactory) -> None:
    job = jobs.torchrun("debug_server_hang.py", nproc=2, args=[str(free_port())])
    job.wait_ready(["rank0", "rank1"], timeout=90)
    report = dump_stacks_remote([f"127.0.0.1:{job.port}"], via="debug-server", timeout=30)
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


def test_debug_server_needs_a_store_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(InvalidInput) as exc:
        dump_stacks_remote(None, via="debug-server")
    assert "MASTER_ADDR" in exc.value.fix


def test_parse_faulthandler_text() -> None:
    text = (
        "Current thread 0x00007fdb850256c0 (most recent call first):\n  <no Python frame>\n\n"
        "Thread 0x00007fdba67ccb80 (most recent call first):\n"
        '  File "/venv/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
        '  File "/job/train.py", line 41 in main\n'
        '  File "/job/train.py", line 46 in <module>\n'
    )
    [main] = parse_faulthandler(text)
    assert main.is_main and [f.function for f in main.frames] == ["all_reduce", "main", "<module>"]
    assert main.frames[1].line == 41


# ----------------------------------------------------------------------------- srun / kubectl end to end


def _fake_tool(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    tool = bindir / name
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)


def test_srun_one_step_labelled_output_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in srun that prints what `srun --label` prints: node n1 answers, node n2's task fails."""
    (tmp_path / "n1.json").write_text(_report("n1", [0, 1], 4).model_dump_json(indent=2))
    _fake_tool(
        tmp_path / "bin",
        "srun",
        f'echo "$@" > {tmp_path}/argv\n'
        f"sed 's/^/0: /' {tmp_path}/n1.json\n"
        "echo '1: bash: rankscope: command not found' >&2\n"
        "echo 'srun: error: n2: task 1: Exited with exit code 127' >&2\nexit 127\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    # as a comma-splitting CLI hands it over: "n[1,2]" cut in two
    report = dump_stacks_remote(["n[1", "2]"], via="srun", job="4242", timeout=20)
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:4] == ["--overlap", "--jobid=4242", "--nodes=2", "--ntasks=2"]
    assert "--nodelist=n1,n2" in argv and "--label" in argv
    assert sorted(r.rank for r in report.job.ranks) == [0, 1] and {r.host for r in report.job.ranks} == {"n1"}
    [err] = [e for e in report.errors if e.rank is None]
    assert err.host == "n2" and err.kind == "not_installed"


def test_kubectl_pods_of_job_then_exec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pods = {"items": [{"metadata": {"name": f"bert-{i}"}, "status": {"phase": "Running"}} for i in range(2)]}
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    for i in range(2):
        (tmp_path / f"bert-{i}.json").write_text(
            _report(f"bert-{i}", [2 * i, 2 * i + 1], 4).model_dump_json()
        )
    _fake_tool(
        tmp_path / "bin",
        "kubectl",
        f'echo "$@" >> {tmp_path}/calls\n'
        f'if [ "$1" = get ]; then cat {tmp_path}/pods.json; exit 0; fi\n'
        f"cat {tmp_path}/$4.json\n",  # kubectl exec -n NS POD -- ...
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    report = dump_stacks_remote(None, via="kubectl", job="bert", namespace="ml", timeout=20)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "get pods -n ml -l job-name=bert -o json"
    assert sorted(calls[1:]) == [
        f"exec -n ml bert-{i} -- rankscope stacks --local --json --timeout 16" for i in range(2)
    ]
    assert {r.rank: r.host for r in report.job.ranks} == {0: "bert-0", 1: "bert-0", 2: "bert-1", 3: "bert-1"}
