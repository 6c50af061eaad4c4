"""Cross-host collection without hosts: hostlists, argv builders, outcome classification and report merging.

The pure tests; the ones that start processes are in tests/integration/test_remote.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rankscope.capabilities.recorder.debug_server import parse_faulthandler
from rankscope.capabilities.remote import (
    classify_failure,
    dump_stacks_remote,
    expand_hostlist,
    hosts_from_environment,
    kubectl_exec_argv,
    kubectl_get_pods_argv,
    merge_reports,
    parse_report,
    pods_from_json,
    split_labelled,
    srun_argv,
    ssh_argv,
    stacks_argv,
)
from rankscope.errors import InvalidInput
from rankscope.models.core import Job, RankProcess, RankStack, StacksReport, Verdict
from rankscope.options import DumpOptions, StacksTarget


def _report(host: str, ranks: list[int], world: int, op: str | None = "all_reduce") -> StacksReport:
    procs = [RankProcess(rank=r, pid=1000 + r, host=host) for r in ranks]
    return StacksReport(
        job=Job(job_id="j1", world_size=world, ranks=procs, hosts=[host]),
        verdict=Verdict(kind="inconclusive", summary="x"),
        stacks=[RankStack(rank=r, pid=1000 + r, host=host, op=op) for r in ranks],
    )


def _fake_tool(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    tool = bindir / name
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)


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


def test_every_stacks_option_reaches_the_remote_command() -> None:
    """--window, --no-counters, --no-fr and --ras travel to every host, not only pid and the dump flags."""
    options = DumpOptions(
        window=7.5, counters=False, flight_recorder=False, ras=True, locals=True, nonblocking=True
    )
    argv = stacks_argv(options)
    for flag in ("--no-counters", "--no-fr", "--ras", "--locals", "--nonblocking"):
        assert flag in argv
    assert argv[argv.index("--window") + 1] == "7.5"
    plain = stacks_argv(DumpOptions())
    assert not {"--no-counters", "--no-fr", "--ras"} & set(plain)
    assert plain[plain.index("--window") + 1] == "1"


def test_command_construction_follows_documented_syntax() -> None:
    remote = stacks_argv(
        DumpOptions(native=True, timeout=30), rankscope_cmd="/opt/venv/bin/rankscope", pid=42
    )
    assert remote == [
        "/opt/venv/bin/rankscope",
        "stacks",
        "--local",
        "--json",
        "--pid",
        "42",
        "--native",
        "--window",
        "1",
        "--timeout",
        "24",
    ]
    assert stacks_argv(DumpOptions(), rankscope_cmd="python -m rankscope")[:4] == [
        "python",
        "-m",
        "rankscope",
        "stacks",
    ]

    ssh = ssh_argv("node1", remote, timeout=30, ssh_options=["-p", "2222"])
    assert ssh[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    assert ssh[5:] == [
        "-p",
        "2222",
        "node1",
        "--",
        "/opt/venv/bin/rankscope stacks --local --json --pid 42 --native --window 1 --timeout 24",
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
        dump_stacks_remote(StacksTarget(hosts=("n1",)), DumpOptions(timeout=0))
    with pytest.raises(InvalidInput):
        dump_stacks_remote(StacksTarget(hosts=("n1",), via="carrier-pigeon"))  # type: ignore[arg-type]
    env = dict(os.environ)
    env.pop("SLURM_JOB_NODELIST", None)
    with pytest.raises(InvalidInput):
        dump_stacks_remote(StacksTarget(via="kubectl"))


def test_debug_server_needs_a_store_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(InvalidInput) as exc:
        dump_stacks_remote(StacksTarget(via="debug-server"))
    assert "MASTER_ADDR" in exc.value.fix


def test_parse_faulthandler_text() -> None:
    text = (
        "Current thread 0x00007fdb850256c0 (most recent call first):\n  <no Python frame>\n\n"
        "Thread 0x00007fdba67ccb80 (most recent call first):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
        '  File "/job/train.py", line 41 in main\n'
        '  File "/job/train.py", line 46 in <module>\n'
    )
    [main] = parse_faulthandler(text)
    assert main.is_main and [f.function for f in main.frames] == ["all_reduce", "main", "<module>"]
    assert main.frames[1].line == 41


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
    report = dump_stacks_remote(
        StacksTarget(hosts=("n[1", "2]"), via="srun", job="4242"), DumpOptions(timeout=20)
    )
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
    report = dump_stacks_remote(
        StacksTarget(via="kubectl", job="bert", namespace="ml"), DumpOptions(timeout=20)
    )
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "get pods -n ml -l job-name=bert -o json"
    assert sorted(calls[1:]) == [
        f"exec -n ml bert-{i} -- rankscope stacks --local --json --window 1 --timeout 16" for i in range(2)
    ]
    assert {r.rank: r.host for r in report.job.ranks} == {0: "bert-0", 1: "bert-0", 2: "bert-1", 3: "bert-1"}
