"""`rankscope stacks` across hosts from the command line: --via without --hosts, Slurm hostlists
in --hosts, --rankscope-cmd. Stand-in srun/kubectl scripts (as in tests/integration/test_remote.py) record
the command line they get. The debug-server path without --hosts (MASTER_ADDR and MASTER_PORT) runs
against a real hung gloo job in test_remote.py, on the job its API check starts."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from rankscope import cli
from rankscope.errors import InvalidInput
from rankscope.models.core import Job, RankProcess, RankStack, StacksReport, Verdict
from rankscope.options import StacksTarget


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _report(host: str, ranks: list[int], world: int) -> StacksReport:
    procs = [RankProcess(rank=r, pid=1000 + r, host=host) for r in ranks]
    return StacksReport(
        job=Job(job_id="j1", world_size=world, ranks=procs, hosts=[host]),
        verdict=Verdict(kind="inconclusive", summary="x"),
        stacks=[RankStack(rank=r, pid=1000 + r, host=host, op="all_reduce") for r in ranks],
    )


def _fake_tool(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    tool = bindir / name
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)


@pytest.mark.parametrize(
    ("value", "hosts"),
    [
        ("node1,node2", ["node1", "node2"]),
        ("node[01-02,05],gpu1", ["node01", "node02", "node05", "gpu1"]),
        (" a , ,b,a", ["a", "b"]),
        ("ssh://me@host:2222,[::1]:22", ["ssh://me@host:2222", "[::1]:22"]),
    ],
)
def test_hosts_split_at_top_level_commas_and_expand_hostlists(value: str, hosts: list[str]) -> None:
    assert StacksTarget(hosts=(value,)).hosts == tuple(hosts)  # --hosts, as the CLI hands it over


def test_empty_or_broken_hosts_are_clean_errors() -> None:
    with pytest.raises(InvalidInput):
        StacksTarget(hosts=(" , ",))
    code, _, err = run_cli("stacks", "--hosts", "node[01-03", "--json")
    assert code == 2 and "Traceback" not in err and "Fix:" in err and "node[01-03" in err


def test_srun_without_hosts_takes_the_allocation_and_rankscope_cmd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "n1.json").write_text(_report("n1", [0, 1], 4).model_dump_json())
    (tmp_path / "n2.json").write_text(_report("n2", [2, 3], 4).model_dump_json())
    _fake_tool(
        tmp_path / "bin",
        "srun",
        f'echo "$@" > {tmp_path}/argv\n'
        f"sed 's/^/0: /' {tmp_path}/n1.json\necho\nsed 's/^/1: /' {tmp_path}/n2.json\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")  # inside the allocation: no need to ask Slurm
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    code, out, err = run_cli("stacks", "--via", "srun", "--rankscope-cmd", "/opt/rs/bin/rankscope", "--json")
    assert code == 0, err
    argv = (tmp_path / "argv").read_text().split()
    assert "--jobid=4242" in argv and "--nodelist=n1,n2" in argv
    assert argv[argv.index("/opt/rs/bin/rankscope") + 1 : argv.index("/opt/rs/bin/rankscope") + 4] == [
        "stacks",
        "--local",
        "--json",
    ]
    report = json.loads(out)
    assert report["job"]["ranks"][0] == {**report["job"]["ranks"][0], "rank": 0, "host": "n1"}
    notes = " ".join(report["job"]["notes"])  # bounded: the rest counted, each host's pids with its ranks
    assert "ranks 0-1 on n1 (pids " in notes and "; ranks 2-3 on n2 (pids " in notes


def test_srun_hosts_keep_commas_inside_brackets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "n1.json").write_text(_report("n1", [0], 1).model_dump_json())
    _fake_tool(tmp_path / "bin", "srun", f'echo "$@" > {tmp_path}/argv\nsed "s/^/0: /" {tmp_path}/n1.json\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    code, _, err = run_cli("stacks", "--via", "srun", "--job", "7", "--hosts", "n[1,3]", "--json")
    assert code == 0, err
    argv = (tmp_path / "argv").read_text().split()
    assert "--nodelist=n1,n3" in argv and "--nodes=2" in argv
    assert "rankscope" in argv  # the default --rankscope-cmd


def test_kubectl_without_hosts_uses_the_jobs_pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pods = {"items": [{"metadata": {"name": "bert-0"}, "status": {"phase": "Running"}}]}
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    (tmp_path / "bert-0.json").write_text(_report("bert-0", [0, 1], 2).model_dump_json())
    _fake_tool(
        tmp_path / "bin",
        "kubectl",
        f'echo "$@" >> {tmp_path}/calls\n'
        f'if [ "$1" = get ]; then cat {tmp_path}/pods.json; exit 0; fi\n'
        f"cat {tmp_path}/$4.json\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    code, out, err = run_cli(
        "stacks", "--via", "kubectl", "--job", "bert", "--namespace", "ml", "--rankscope-cmd", "rs", "--json"
    )
    assert code == 0, err
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "get pods -n ml -l job-name=bert -o json"
    assert calls[1].startswith("exec -n ml bert-0 -- rs stacks --local --json")
    assert "ranks 0-1 on" in " ".join(json.loads(out)["job"]["notes"])


def test_debug_server_without_an_address_is_a_clean_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    code, _, err = run_cli("stacks", "--via", "debug-server", "--json")
    assert code == 2 and "Traceback" not in err
    assert "Fix:" in err and "MASTER_ADDR" in err
