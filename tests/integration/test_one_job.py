"""One job, wherever its ranks are: two torchrun agents of one job on this host are one job."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankscope.api import dump_stacks, find_job, list_jobs
from rankscope.errors import NotADistributedJob, ProcessNotFound
from tests.jobs import JobFactory, RunningJob, free_port, wait_for

pytestmark = pytest.mark.slow

READY_S = 180.0


@dataclass
class TwoAgents:
    """The two agents of one job and the folder both were started in."""

    node0: RunningJob
    node1: RunningJob
    folder: Path


@pytest.fixture(scope="module")
def two_agents(module_jobs: JobFactory, tmp_path_factory: pytest.TempPathFactory) -> TwoAgents:
    """A 4-rank job as two agents of 2 ranks (--nnodes=2 on one host), both started in a folder of
    their own; rank 3 skips an all_reduce. The module's tests only read it."""
    folder = tmp_path_factory.mktemp("two-agents")
    port = free_port()
    args = ["--mode", "mismatch", "--odd", "3"]
    node0 = module_jobs.torchrun_node("hang_collectives.py", 0, 2, port, args=args, cwd=folder)
    node1 = module_jobs.torchrun_node("hang_collectives.py", 1, 2, port, args=args, cwd=folder)
    node0.wait_ready(["rank0", "rank1"], timeout=READY_S)
    node1.wait_ready(["rank2", "rank3"], timeout=READY_S)
    return TwoAgents(node0, node1, folder)


def _settled(pid: int | None, want: list[int], job_id: str | None = None) -> object:
    box: list[object] = []

    def ok() -> bool:
        report = dump_stacks(pid, job_id=job_id)
        box[:] = [report]
        return report.verdict.suspect_ranks == want

    wait_for(ok, 90, f"suspects {want}", interval=0.5)
    return box[0]


def test_two_agents_of_one_job_are_one_job(
    two_agents: TwoAgents, pyspy_works: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node0, node1 = two_agents.node0, two_agents.node1
    monkeypatch.chdir(two_agents.folder)  # no pid: the job started here, whatever else runs on the host
    listed = [j for j in list_jobs().jobs if node0.pid in j.launcher_pids]
    assert len(listed) == 1
    job = listed[0]
    assert sorted(job.launcher_pids) == sorted([node0.pid, node1.pid])
    assert job.launcher_pid == node0.pid  # the agent of node 0
    assert sorted(r.rank for r in job.ranks) == [0, 1, 2, 3] and job.missing_ranks == [] and job.missing == []
    assert job.attempt == 0
    # no pid, either agent's pid, a rank's pid: the same job and the same culprit
    for pid in (None, node0.pid, node1.pid, job.ranks[0].pid):
        report = _settled(pid, [3])
        assert sorted(r.rank for r in report.job.ranks) == [0, 1, 2, 3]  # type: ignore[attr-defined]
        assert report.verdict.kind == "mismatched_collectives"  # type: ignore[attr-defined]
    # a rank filter: the others are not missing, and the verdict says it covers only those asked for
    filtered = dump_stacks(node0.pid, ranks=[0, 1])
    assert filtered.job.missing_ranks == [] and filtered.verdict.kind != "missing_ranks"
    assert any("only ranks [0, 1]" in n for n in filtered.job.notes)


def test_several_jobs_error_lists_them_and_job_id_picks_one(
    two_agents: TwoAgents, jobs: JobFactory, pyspy_works: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two-agent job and an idle 2-rank one: asked for no job in particular, the error lists
    both (the first with both its agents); its id picks it, and the verdict is on it alone."""
    second = jobs.torchrun("hang_collectives.py", nproc=2, args=["--mode", "idle"])
    second.wait_ready(timeout=READY_S)
    monkeypatch.chdir(tmp_path)  # a folder no job was started in (another test's job may run in the repo's)
    with pytest.raises(NotADistributedJob) as err:
        find_job()
    text = str(err.value)
    one = find_job(two_agents.node0.pid)
    assert sorted(one.launcher_pids) == sorted([two_agents.node0.pid, two_agents.node1.pid])
    agents = ", ".join(map(str, one.launcher_pids))
    assert f"launcher pid(s) {agents}" in text and f"launcher pid(s) {second.pid}" in text
    assert "world size 4" in text and "world size 2" in text and "--job" in (err.value.fix or "")
    report = _settled(None, [3], job_id=one.job_id)
    assert report.job.job_id == one.job_id  # type: ignore[attr-defined]
    with pytest.raises(ProcessNotFound):
        find_job(job_id="torchrun:no-such-job")


def test_pid_of_an_unrelated_python_process_is_refused() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(NotADistributedJob):
            find_job(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_restarted_torchrun_job_is_its_latest_attempt(jobs: JobFactory, pyspy_works: str) -> None:
    """``--max-restarts=1``: rank 1 dies (exit 3) in attempt 0; torchrun restarts both ranks, and in
    attempt 1 rank 1 never reaches init_process_group. Discovery shows attempt 1 and only its pids."""
    from tests.jobs import torchrun_argv

    port = free_port()
    argv = torchrun_argv(
        "restart_once.py",
        "--nproc_per_node=2",
        "--max-restarts=1",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
    )
    job = jobs.start(argv, nproc=2, port=port, tag="restart")
    job.wait_ready(["attempt0-rank0", "attempt0-rank1", "attempt1-rank0", "attempt1-rank1"], timeout=READY_S)
    found = find_job(job.pid)
    assert found.attempt == 1
    pids = sorted(r.pid for r in found.ranks)
    for pid in pids:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            assert b"TORCHELASTIC_RESTART_COUNT=1\x00" in fh.read()
    assert sorted(r.rank for r in found.ranks) == [0, 1] and found.missing == []
    report = _settled(job.pid, [1])
    assert sorted(s.pid for s in report.stacks) == pids  # type: ignore[attr-defined]
    assert report.job.attempt == 1  # type: ignore[attr-defined]
    v = report.verdict  # type: ignore[attr-defined]
    assert (
        v.kind == "divergent_ranks" and "rank 0 waits in init_process_group at restart_once.py" in v.summary
    )


def test_a_rank_that_left_early_says_why_from_torchruns_log_folder(
    jobs: JobFactory, pyspy_works: str, tmp_path: object
) -> None:
    """``--log-dir D --redirects 3``: rank 1 returns early (exit 0, so torchrun keeps the job up) after
    a line on stderr; rank 0 waits for it. The missing rank is 'exited', with that line and where it is."""
    from pathlib import Path

    from tests.jobs import torchrun_argv

    logs = Path(str(tmp_path)) / "logs"
    port = free_port()
    argv = torchrun_argv(
        "early_exit.py",
        "--nproc_per_node=2",
        f"--log_dir={logs}",
        "--redirects=3",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
    )
    job = jobs.start(argv, nproc=2, port=port, tag="logdir")
    job.wait_ready(["rank0", "rank1", "rank0-waits"], timeout=READY_S)
    wait_for(lambda: [r.rank for r in find_job(job.pid).ranks] == [0], 60, "rank 1 gone")
    (gone,) = find_job(job.pid).missing
    assert (gone.rank, gone.status) == (1, "exited")
    assert "stderr.log: rank 1: StopIteration: the shard has no batch 2, leaving the loop" in gone.detail
    assert str(logs) in gone.detail
    report = dump_stacks(job.pid)
    assert report.verdict.suspect_ranks == [1] and report.verdict.kind == "missing_ranks", report.verdict
