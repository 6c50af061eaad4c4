"""Discovery from /proc against real processes started the way each launcher starts ranks.

The stand-in ranks (tests/programs/fake_rank.py) do not import torch, so these tests
are fast; the real torchrun / mp.spawn jobs are in test_stacks_live.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.capabilities.discovery import ProcInfo, build_jobs, find_job, list_jobs, proc_state
from rankscope.errors import NotADistributedJob, ProcessNotFound
from rankscope.models.core import Job
from tests.jobs import JobFactory, RunningJob, wait_for


def launch(
    jobs: JobFactory, kind: str, n: int, world: int, *extra: str, ready: list[str] | None = None
) -> RunningJob:
    job = jobs.python("fake_launcher.py", nproc=n, args=[kind, str(n), str(world), *extra])
    job.wait_ready(ready if ready is not None else ["launched", *[f"rank{r}" for r in range(n)]], timeout=60)
    return job


def job_of(job: RunningJob) -> Job:
    return find_job(job.pid)


def test_torchrun_env_ranks_with_workers_and_redacted_cmdline(jobs: JobFactory) -> None:
    job = launch(jobs, "torchrun", 2, 2, "--with-worker", "--password=pa55word-xyz")
    found = job_of(job)
    assert found.launcher == "torchrun" and found.launcher_pid == job.pid
    assert found.world_size == 2 and found.missing_ranks == [] and found.exited_ranks == []
    assert found.job_id.startswith("torchrun:fake-")
    assert [(r.rank, r.local_rank, r.rank_source) for r in found.ranks] == [
        (0, 0, "env:RANK"),
        (1, 1, "env:RANK"),
    ]
    for r in found.ranks:
        # the worker inherited RANK but is the rank's child, not a rank
        assert len(r.children) == 1
        assert find_job(r.children[0]).job_id == found.job_id
        assert "--password=<redacted>" in r.cmdline and not any("pa55word" in w for w in r.cmdline)
        assert r.state == "sleeping" and r.python
    listed = [j for j in list_jobs().jobs if j.launcher_pid == job.pid]
    assert len(listed) == 1 and len(listed[0].ranks) == 2
    assert list_jobs(job.pid).jobs[0].job_id == found.job_id


@pytest.mark.parametrize(
    ("kind", "launcher", "source"),
    [
        ("slurm", "slurm", "env:SLURM_PROCID"),
        ("mpi", "mpi", "env:OMPI_COMM_WORLD_RANK"),
        ("pmi", "mpi", "env:PMI_RANK"),
    ],
)
def test_slurm_and_mpi_ranks_and_ranks_on_other_hosts(
    jobs: JobFactory, kind: str, launcher: str, source: str
) -> None:
    job = launch(jobs, kind, 2, 4)
    found = job_of(job)
    assert found.launcher == launcher
    assert [r.rank for r in found.ranks] == [0, 1] and {r.rank_source for r in found.ranks} == {source}
    assert found.world_size == 4
    assert found.missing_ranks == [2, 3] and found.exited_ranks == []


def test_shell_wrapper_carrying_rank_is_not_a_rank(jobs: JobFactory) -> None:
    job = launch(jobs, "env", 2, 2, "--shell")
    found = job_of(job)
    assert found.launcher == "env"
    assert len(found.ranks) == 2
    for r in found.ranks:
        assert os.path.basename(r.python or "").startswith("python")
    # the bash wrappers in between still resolve to the job
    wrappers = [p for p in job.rank_pids() if p not in {r.pid for r in found.ranks}]
    assert wrappers and all(find_job(w).job_id == found.job_id for w in wrappers)


def test_exited_rank_is_a_zombie_and_counted_exited(jobs: JobFactory) -> None:
    job = launch(jobs, "torchrun", 3, 3, "--exit-rank", "2", ready=["launched", "rank0", "rank1"])
    wait_for(
        lambda: any(proc_state(p) == "zombie" for p in job.rank_pids()), 30, "the exited rank to be a zombie"
    )
    found = job_of(job)
    assert [r.rank for r in found.ranks] == [0, 1]
    assert found.missing_ranks == [2] and found.exited_ranks == [2]
    assert any("zombie" in n for n in found.notes)


def test_stopped_rank_state(jobs: JobFactory) -> None:
    job = launch(jobs, "env", 2, 2)
    found = job_of(job)
    pid = found.ranks[1].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: proc_state(pid) == "stopped", 30, "SIGSTOP to land")
        assert job_of(job).ranks[1].state == "stopped"
    finally:
        os.kill(pid, signal.SIGCONT)


def test_several_jobs_need_a_pid(jobs: JobFactory) -> None:
    a = launch(jobs, "env", 1, 1)
    b = launch(jobs, "torchrun", 1, 1)
    assert job_of(a).job_id != job_of(b).job_id
    with pytest.raises(NotADistributedJob) as info:
        find_job(None)
    assert str(a.pid) in info.value.message or str(b.pid) in info.value.message
    assert "--pid" in info.value.fix


def test_several_jobs_one_started_here(
    jobs: JobFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from the folder a job was started in (or below it), rankscope takes that job and says so;
    from anywhere else it lists the jobs with their folders and asks."""
    here, there = tmp_path / "exp-a", tmp_path / "exp-b"
    (here / "logs").mkdir(parents=True)
    there.mkdir()
    a = jobs.python("fake_launcher.py", nproc=1, args=["env", "1", "1"], cwd=here)
    b = jobs.python("fake_launcher.py", nproc=1, args=["torchrun", "1", "1"], cwd=there)
    for job in (a, b):
        job.wait_ready(["launched", "rank0"], timeout=60)
    for folder in (here, here / "logs"):
        monkeypatch.chdir(folder)
        found = find_job(None)
        assert found.job_id == job_of(a).job_id
        assert any("started in the current folder" in n and job_of(b).job_id in n for n in found.notes)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotADistributedJob) as info:
        find_job(None)
    assert f"started in {here}" in info.value.message and f"started in {there}" in info.value.message
    assert "folder the job was started in" in info.value.fix


def test_pids_that_are_no_job() -> None:
    with pytest.raises(ProcessNotFound):
        find_job(2**22 + 12345)
    sleeper = subprocess.Popen(["sleep", "600"])
    plain = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
    try:
        with pytest.raises(NotADistributedJob, match="not a Python process"):
            find_job(sleeper.pid)
        with pytest.raises(NotADistributedJob, match="not part of a distributed PyTorch job"):
            find_job(plain.pid)
    finally:
        for p in (sleeper, plain):
            p.kill()
            p.wait(timeout=10)


def test_launcher_with_a_leaked_rank_variable_is_not_a_rank() -> None:
    """torchrun started from a shell that exported RANK: the agent stays the launcher."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    py = "/usr/bin/python3.11"
    agent = ProcInfo(100, 1, "sleeping", 1, [py, "-m", "torch.distributed.run", "train.py"], env, exe=py)
    ranks = [
        ProcInfo(
            101 + r,
            100,
            "sleeping",
            2,
            [py, "-u", "train.py"],
            {**env, "RANK": str(r), "LOCAL_RANK": str(r), "TORCHELASTIC_RUN_ID": "abc"},
            exe=py,
        )
        for r in range(2)
    ]
    procs = {p.pid: p for p in (agent, *ranks)}
    agent.children = [101, 102]
    jobs = build_jobs(procs, "h")
    assert len(jobs) == 1
    assert jobs[0].launcher == "torchrun" and jobs[0].launcher_pid == 100 and jobs[0].job_id == "torchrun:abc"
    assert [(r.rank, r.pid) for r in jobs[0].ranks] == [(0, 101), (1, 102)]


def _torchrun_rank(
    pid: int, agent: int, rank: int, attempt: int, port: str = "29500", lws: int = 2
) -> ProcInfo:
    py = "/usr/bin/python3.11"
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % lws),
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": str(lws),
        "GROUP_RANK": str(rank // lws),
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": port,
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
    }
    return ProcInfo(pid, agent, "sleeping", 2, [py, "-u", "train.py"], env, exe=py)


def test_agents_of_one_rendezvous_are_one_job_and_missing_ranks_are_classified() -> None:
    py = "/usr/bin/python3.11"
    agents = [
        ProcInfo(a, 1, "sleeping", 1, [py, "-m", "torch.distributed.run", "t.py"], {}, exe=py)
        for a in (100, 200)
    ]
    ranks = [_torchrun_rank(101, 100, 0, 0), _torchrun_rank(102, 100, 1, 0), _torchrun_rank(201, 200, 2, 0)]
    other = _torchrun_rank(301, 300, 0, 0, port="29600", lws=4)  # another job: another port
    procs = {p.pid: p for p in (*agents, *ranks, other)}
    jobs = build_jobs(procs, "h")
    assert len(jobs) == 2
    job = next(j for j in jobs if j.master_port == 29500)
    assert job.launcher_pids == [100, 200] and job.launcher_pid == 100
    assert [r.rank for r in job.ranks] == [0, 1, 2]
    # rank 3 was started by agent 200 (ranks 2-3) and is gone: exited, not "on another host"
    assert [(m.rank, m.status) for m in job.missing] == [(3, "exited")]
    lone = next(j for j in jobs if j.master_port == 29600)
    assert {(m.rank, m.status) for m in lone.missing} == {(1, "exited"), (2, "exited"), (3, "exited")}


def test_ranks_of_an_earlier_attempt_are_left_out() -> None:
    ranks = [_torchrun_rank(101, 100, 0, 0), _torchrun_rank(111, 100, 0, 1), _torchrun_rank(112, 100, 1, 1)]
    jobs = build_jobs({p.pid: p for p in ranks}, "h")
    assert len(jobs) == 1
    job = jobs[0]
    assert job.attempt == 1 and [r.pid for r in job.ranks] == [111, 112]
    assert any("earlier torchrun attempt" in n and "101" in n for n in job.notes)
    # ranks 2-3 belong to an agent on another host: not visible, never blamed from here
    assert [(m.rank, m.status) for m in job.missing] == [(2, "not_visible"), (3, "not_visible")]


def test_a_rank_gone_from_its_agent_gets_the_exit_code_of_the_agents_unreaped_child() -> None:
    """Agent 200 started ranks 2-3; rank 3 is gone and the agent has one zombie child (a real one,
    whose /proc/PID/stat says it exited with 3): that is rank 3, exit code 3."""
    import subprocess
    import sys

    from tests.jobs import wait_for

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    try:
        from rankscope.runtime.procfs import read_stat

        wait_for(lambda: (read_stat(child.pid) or (0, "", 0))[1] == "zombie", 30, "a zombie")
        py = "/usr/bin/python3.11"
        agent = ProcInfo(200, 1, "sleeping", 1, [py, "-m", "torch.distributed.run", "t.py"], {}, exe=py)
        agent.children = [201, child.pid]
        zombie = ProcInfo(child.pid, 200, "zombie", 2, [], None)
        ranks = [
            _torchrun_rank(101, 100, 0, 0),
            _torchrun_rank(102, 100, 1, 0),
            _torchrun_rank(201, 200, 2, 0),
        ]
        job = build_jobs({p.pid: p for p in (agent, zombie, *ranks)}, "h")[0]
        (gone,) = job.missing
        assert (gone.rank, gone.status, gone.exit_code) == (3, "exited", 3)
        assert f"pid {child.pid} exit code 3" in gone.detail
    finally:
        child.wait(timeout=30)


def _gone_rank_detail(tmp_path: Path, files: dict[str, str]) -> str:
    """Agent 200 started ranks 2-3 with torchrun's log folder under ``tmp_path``; rank 3 is gone and
    left ``files`` in its folder (attempt_0/1)."""
    attempt = tmp_path / "none_abc" / "attempt_0"
    for local in (0, 1):
        (attempt / str(local)).mkdir(parents=True)
    for name, text in files.items():
        (attempt / "1" / name).write_text(text)
    live = _torchrun_rank(201, 200, 2, 0)
    assert live.env is not None
    live.env["TORCHELASTIC_ERROR_FILE"] = str(attempt / "0" / "error.json")
    ranks = [_torchrun_rank(101, 100, 0, 0), _torchrun_rank(102, 100, 1, 0), live]
    (gone,) = build_jobs({p.pid: p for p in ranks}, "h")[0].missing
    assert (gone.rank, gone.status) == (3, "exited")
    return gone.detail


def test_a_gone_rank_says_its_last_words_from_torchruns_log_folder(tmp_path: Path) -> None:
    record = {
        "message": {
            "message": "RuntimeError: CUDA error: an illegal memory access was encountered",
            "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1764108000"},
        }
    }
    detail = _gone_rank_detail(tmp_path, {"error.json": json.dumps(record), "stderr.log": "noise\n"})
    assert detail.endswith(
        "attempt_0/1/error.json: RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    stderr = 'step 3\nTraceback (most recent call last):\n  File "t.py", line 9\nValueError: batch 17 is empty\nbye\n'
    detail = _gone_rank_detail(tmp_path / "b", {"stderr.log": stderr})
    assert detail.endswith("attempt_0/1/stderr.log: ValueError: batch 17 is empty")
    # libstdc++'s words at exit (gloo threads still joinable) follow the rank's own and say nothing
    exiting = "StopIteration: the shard has no batch 2\nterminate called without an active exception\n"
    detail = _gone_rank_detail(tmp_path / "e", {"stderr.log": exiting})
    assert detail.endswith("attempt_0/1/stderr.log: StopIteration: the shard has no batch 2")
    assert _gone_rank_detail(tmp_path / "c", {}).endswith("; its logs say why")
    assert _gone_rank_detail(tmp_path / "d", {"error.json": "{broken"}).endswith("; its logs say why")
