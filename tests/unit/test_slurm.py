"""`--via srun` from a login node: the job's nodes asked of Slurm (scontrol's records parsed), the
errors that say what to do, and, on a node, the Slurm job's ranks chosen and rankscope's own srun
step never taken for a job. Stand-in scontrol/srun scripts print what Slurm 22.05 prints; the
real daemons are in tests/integration/test_slurm.py."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from rankscope.capabilities import discovery, slurm
from rankscope.capabilities.discovery import ProcInfo, build_jobs, of_slurm_job
from rankscope.capabilities.remote import classify_failure, dump_stacks_remote
from rankscope.capabilities.slurm import (
    allocation_nodes,
    job_nodes,
    parse_job_records,
    parse_workdirs,
    slurm_job_id,
    slurm_target,
    srun_env,
    started_in,
)
from rankscope.errors import (
    InvalidInput,
    NoJobsFound,
    SlurmJobNotFound,
    SlurmJobNotRunning,
    SlurmJobNotYours,
)
from rankscope.models.core import Job, RankProcess, RankStack, StacksReport, Verdict
from rankscope.options import DumpOptions, StacksTarget

RUNNING = (
    "JobId=77 JobName=wrap UserId=alice(1001) GroupId=alice(1001) JobState=RUNNING Reason=None "
    "ExitCode=0:0 RunTime=00:01:05 NodeList=gpu[01-02] BatchHost=gpu01 NumNodes=2 "
    "StdOut=/home/alice/my runs/slurm-77.out Power="
)


def _record(**changes: str) -> str:
    fields = parse_job_records(RUNNING)[0] | changes
    return " ".join(f"{k}={v}" for k, v in fields.items())


def test_scontrol_records_keep_values_with_spaces() -> None:
    [rec] = parse_job_records(RUNNING + "\n")
    assert rec["JobState"] == "RUNNING" and rec["NodeList"] == "gpu[01-02]"
    assert rec["StdOut"] == "/home/alice/my runs/slurm-77.out" and rec["Power"] == ""


def test_running_job_nodes_expanded_and_components_joined() -> None:
    assert job_nodes("77", parse_job_records(RUNNING), 1001) == ["gpu01", "gpu02"]
    het = parse_job_records(RUNNING + "\n" + _record(NodeList="gpu[02-03]", JobId="78"))
    assert job_nodes("77", het, 0) == ["gpu01", "gpu02", "gpu03"]  # root joins anyone's job


@pytest.mark.parametrize(
    ("changes", "error", "says"),
    [
        (
            {"JobState": "PENDING", "Reason": "Resources"},
            SlurmJobNotRunning,
            ["PENDING (Reason=Resources)", "squeue -j 77"],
        ),
        ({"JobState": "SUSPENDED"}, SlurmJobNotRunning, ["SUSPENDED", "scontrol resume 77"]),
        (
            {"JobState": "FAILED", "ExitCode": "1:0"},
            SlurmJobNotRunning,
            ["FAILED (exit code 1:0)", "rankscope triage /home/alice/my runs/slurm-77.out"],
        ),
        ({"UserId": "bob(1002)"}, SlurmJobNotYours, ["belongs to bob (uid 1002)", "sudo -u bob"]),
    ],
)
def test_jobs_that_cannot_be_joined_say_why_and_what_to_do(
    changes: dict[str, str], error: type[Exception], says: list[str]
) -> None:
    with pytest.raises(error) as exc:
        job_nodes("77", parse_job_records(_record(**changes)), 1001)
    text = exc.value.render()  # type: ignore[attr-defined]
    assert all(s in text for s in says), text
    assert "Fix: " in text


def test_unknown_job_and_bad_ids() -> None:
    with pytest.raises(SlurmJobNotFound) as exc:
        job_nodes("77", [], 1001)
    assert "squeue --me" in exc.value.fix
    with pytest.raises(InvalidInput) as bad:
        dump_stacks_remote(StacksTarget(via="srun", job="abc"))
    assert "not a Slurm job id" in bad.value.message


def _fake_tool(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    tool = bindir / name
    tool.write_text("#!/bin/sh\nPATH=/usr/bin:/bin\n" + body)  # the caller's PATH holds no Slurm
    tool.chmod(0o755)


def _report(host: str, ranks: list[int]) -> StacksReport:
    procs = [RankProcess(rank=r, pid=1000 + r, host=host) for r in ranks]
    return StacksReport(
        job=Job(job_id="torchrun:x", world_size=4, ranks=procs, hosts=[host]),
        verdict=Verdict(kind="inconclusive", summary="x"),
        stacks=[RankStack(rank=r, pid=1000 + r, host=host, op="all_reduce") for r in ranks],
    )


@pytest.fixture
def login_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A login node: Slurm's clients on PATH (stand-ins), no allocation in the environment."""
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    return tmp_path


def test_login_node_asks_slurm_for_the_jobs_nodes(login_node: Path) -> None:
    tmp = login_node
    for i, host in enumerate(("gpu01", "gpu02")):
        (tmp / f"{host}.json").write_text(_report(host, [2 * i, 2 * i + 1]).model_dump_json())
    _fake_tool(
        tmp / "bin",
        "scontrol",
        f'echo "$@" > {tmp}/scontrol\necho "{RUNNING.replace("alice(1001)", "me(0)")}"\n',
    )
    _fake_tool(
        tmp / "bin",
        "srun",
        f'echo "$@" > {tmp}/srun\nsed "s/^/0: /" {tmp}/gpu01.json\necho\nsed "s/^/1: /" {tmp}/gpu02.json\n',
    )
    report = dump_stacks_remote(StacksTarget(via="srun", job="77"), DumpOptions(timeout=20))
    assert (tmp / "scontrol").read_text().split() == ["show", "job", "-o", "77"]
    srun = (tmp / "srun").read_text().split()
    assert "--jobid=77" in srun and "--nodelist=gpu01,gpu02" in srun and "--overlap" in srun
    assert sorted(r.rank for r in report.job.ranks) == [0, 1, 2, 3]


def test_login_node_errors(login_node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidInput) as absent:
        dump_stacks_remote(StacksTarget(via="srun", job="77"))
    assert "`srun` on this machine" in absent.value.message and "squeue --me" in absent.value.fix
    _fake_tool(login_node / "bin", "srun", "exit 0\n")
    _fake_tool(
        login_node / "bin", "scontrol", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1\n"
    )
    with pytest.raises(SlurmJobNotFound) as unknown:
        dump_stacks_remote(StacksTarget(via="srun", job="77"))
    assert "Slurm does not know job 77" in unknown.value.message
    with pytest.raises(InvalidInput) as no_job:
        dump_stacks_remote(StacksTarget(via="srun"))
    assert "SLURM_JOB_ID is unset" in no_job.value.message and "job=JOBID" in no_job.value.fix


def test_srun_that_cannot_join_the_job() -> None:
    err = classify_failure(
        "n1",
        "srun",
        1,
        "srun: error: Unable to confirm allocation for job 5: Access/permission denied\n",
        timed_out=False,
        timeout=10,
    )
    assert (
        err.kind == "unreachable" and "Access/permission denied" in err.message and "squeue --me" in err.fix
    )


def _proc(pid: int, ppid: int, cmdline: list[str], env: dict[str, str]) -> ProcInfo:
    return ProcInfo(pid, ppid, "sleeping", pid, cmdline, env, exe="/usr/bin/python3")


def _torchrun_rank(pid: int, rank: int, port: str, slurm_job: str | None) -> ProcInfo:
    env = {"RANK": str(rank), "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "none"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    if slurm_job:
        env |= {"SLURM_JOB_ID": slurm_job, "SLURM_PROCID": "0"}
    return _proc(pid, 1, ["python", "train.py"], env)


def test_rankscope_in_a_step_is_no_rank_and_the_allocation_picks_its_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step_env = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "1", "SLURM_PROCID": "0"}
    procs = {
        p.pid: p
        for p in (
            _torchrun_rank(900001, 0, "29500", None),
            _torchrun_rank(900002, 0, "29600", "5"),
            _proc(900003, 1, ["/venv/bin/python", "/venv/bin/rankscope", "stacks", "--local"], step_env),
            _proc(900004, 1, ["python3", "-m", "rankscope", "stacks", "--local"], step_env),
        )
    }
    jobs = build_jobs(procs, "n1")
    assert sorted(j.job_id for j in jobs) == ["torchrun:127.0.0.1:29500", "torchrun:127.0.0.1:29600"]
    assert [j.ranks[0].pid for j in of_slurm_job(jobs, procs, "5")] == [900002]
    assert of_slurm_job(jobs, procs, None) == [] and of_slurm_job(jobs, procs, "6") == []
    monkeypatch.setattr(discovery, "scan", lambda: procs)
    monkeypatch.setattr(discovery, "read_environ", lambda pid: procs[pid].env if pid in procs else None)
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    assert discovery.find_job().ranks[0].pid == 900002  # the call's own allocation, among two jobs
    monkeypatch.delenv("SLURM_JOB_ID")
    assert discovery.find_job(job_id="5").ranks[0].pid == 900002  # a Slurm job id names its ranks here


@pytest.mark.parametrize(
    ("env", "call", "via"),
    [
        ({"SLURM_JOB_ID": "5"}, {}, "srun"),  # beside an allocation (salloc on a login node): its nodes
        ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "gpu[01-02]"}, {}, "srun"),  # a part of the job here
        ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "gpu01"}, {}, "ssh"),  # the only node: this host
        # a step started with `srun --jobid` from outside: the step's node, and the job's
        ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "gpu01", "SLURM_NODELIST": "gpu[01-02]"}, {}, "srun"),
        ({}, {}, "ssh"),  # no Slurm
        ({"SLURM_JOB_ID": "5"}, {"pid": 42}, "ssh"),  # a pid, a job or ranks of this host keep it here
        ({"SLURM_JOB_ID": "5"}, {"job_id": "torchrun:x"}, "ssh"),
        ({"SLURM_JOB_ID": "5"}, {"ranks": [0]}, "ssh"),
    ],
)
def test_a_plain_call_in_or_beside_an_allocation_collects_its_nodes(
    login_node: Path, env: dict[str, str], call: dict[str, Any], via: str
) -> None:
    _fake_tool(login_node / "bin", "srun", "exit 0\n")
    target = slurm_target(StacksTarget(), env=env, host="gpu01.cluster", **call)
    assert target.via == via and target.remote == (via == "srun")
    hosts = StacksTarget(hosts=("gpu01",))
    assert slurm_target(hosts, env={"SLURM_JOB_ID": "5"}, host="login") is hosts


@pytest.mark.parametrize(
    ("given", "job"),
    [
        ("1234", "1234"),
        (" 1234 ", "1234"),
        ("1234_7", "1234_7"),
        ("1234+1", "1234+1"),
        ("slurm:1234.0", "1234"),
        ("1234.batch", "1234"),
    ],
)
def test_slurm_job_ids_as_squeue_and_rankscope_print_them(given: str, job: str) -> None:
    assert slurm_job_id(given) == job


@pytest.mark.parametrize("given", ["", "abc", "torchrun:127.0.0.1:29500", "12.34.56", "-1"])
def test_not_a_slurm_job_id(given: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        slurm_job_id(given)
    assert "not a Slurm job id" in exc.value.message and "squeue --me" in exc.value.fix


def test_no_job_here_on_a_slurm_login_node_names_the_srun_call(
    login_node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discovery, "scan", dict)
    with pytest.raises(NoJobsFound) as bare:
        discovery.find_job()
    assert "--via srun" not in bare.value.fix  # no Slurm here: the fix does not send anyone to it
    _fake_tool(login_node / "bin", "squeue", "exit 0\n")
    with pytest.raises(NoJobsFound) as slurm:
        discovery.find_job()
    assert slurm.value.fix.startswith(NoJobsFound.check)  # first the host and the user, checked in a second
    assert "On a Slurm cluster: `rankscope stacks --via srun --job JOBID`" in slurm.value.fix


def test_allocation_nodes_join_the_jobs_and_the_steps_lists() -> None:
    env = {"SLURM_JOB_NODELIST": "gpu02", "SLURM_NODELIST": "gpu[01-03]"}
    assert allocation_nodes(env) == ["gpu02", "gpu01", "gpu03"]
    assert allocation_nodes({}) == []


def test_srun_env_drops_the_allocations_variables_and_keeps_the_cluster() -> None:
    env = {"PATH": "/bin", "SLURM_CONF": "/etc/x.conf", "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1"}
    assert srun_env(env) == {"PATH": "/bin", "SLURM_CONF": "/etc/x.conf"}


def test_the_slurm_job_started_in_this_folder() -> None:
    rows = parse_workdirs("77|/home/a/bert\n78|/home/a/gpt/\n79|/home/a\nbad line\n80|/\n")
    assert rows == [("77", "/home/a/bert"), ("78", "/home/a/gpt/"), ("79", "/home/a"), ("80", "/")]
    assert started_in(rows, "/home/a/bert", "/home/a") == "77"
    assert started_in(rows, "/home/a/gpt/logs", "/home/a") == "78"  # a folder under the job's
    assert started_in(rows, "/home/a/other", "/home/a") is None  # the home folder and / are too broad
    assert started_in([*rows, ("81", "/home/a/bert")], "/home/a/bert", "/home/a") is None  # two: no pick


def test_a_plain_call_on_a_login_node_takes_the_job_of_its_folder(
    login_node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_tool(login_node / "bin", "srun", "exit 0\n")
    _fake_tool(login_node / "bin", "squeue", f'echo "$@" > {login_node}/squeue\necho "77|/home/a/bert"\n')
    conf = {"SLURM_CONF": "/etc/cluster/slurm.conf"}
    target = slurm_target(StacksTarget(), env=conf, cwd="/home/a/bert")
    assert (target.via, target.job) == ("srun", "77")
    assert (login_node / "squeue").read_text().split() == ["--me", "-h", "-t", "RUNNING", "-o", "%i|%Z"]
    assert slurm_target(StacksTarget(), env=conf, cwd="/home/a/gpt") == StacksTarget()
    (login_node / "squeue").unlink()
    monkeypatch.setattr(slurm, "CONF_FILES", ())  # Slurm installed, no cluster named: squeue is not asked
    assert slurm_target(StacksTarget(), env={}, cwd="/home/a/bert") == StacksTarget()
    assert not (login_node / "squeue").exists()
    _fake_tool(
        login_node / "bin", "squeue", "echo 'squeue: error: Unable to contact slurm controller' >&2; exit 1\n"
    )
    assert slurm_target(StacksTarget(), env=conf, cwd="/home/a/bert") == StacksTarget()  # Slurm down: here


def test_via_srun_takes_the_job_as_srun_does() -> None:
    target = slurm_target(StacksTarget(via="srun", job="slurm:1234.0"))
    assert (target.via, target.job) == ("srun", "1234")
    with pytest.raises(InvalidInput):
        slurm_target(StacksTarget(via="srun", job="torchrun:127.0.0.1:29500"))


def test_srun_steps_run_this_rankscope_where_none_is_on_the_path(login_node: Path) -> None:
    """srun's steps get the caller's PATH: without rankscope on it, this interpreter's -m rankscope."""
    found = slurm_target(StacksTarget(via="srun", job="5"), env={"PATH": str(login_node / "bin")})
    assert shlex.split(found.rankscope_cmd) == [sys.executable, "-m", "rankscope"]
    _fake_tool(login_node / "bin", "rankscope", "exit 0\n")
    on_path = slurm_target(StacksTarget(via="srun", job="5"), env={"PATH": str(login_node / "bin")})
    assert on_path.rankscope_cmd == "rankscope"
    given = StacksTarget(via="srun", job="5", rankscope_cmd="/opt/rs/bin/rankscope")
    assert slurm_target(given, env={"PATH": "/nowhere"}).rankscope_cmd == "/opt/rs/bin/rankscope"
