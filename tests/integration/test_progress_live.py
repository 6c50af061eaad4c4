"""Hung, slow or fine, on real gloo jobs that are not hung: rankscope watches before it names anyone.

Each job marks itself ready once it is where the test wants it (tests/programs/progress_jobs.py);
the jobs are reaped by the ``jobs`` fixture, pass or fail. Live NCCL jobs of the same kinds were
captured on a GPU (tests/data/progress_nccl) and are replayed in tests/unit/test_progress_nccl.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

from rankscope.analysis.hang.progress import STRAGGLER_GAP_PCT
from rankscope.analysis.hang.progress_verdict import PROGRESS_KINDS
from rankscope.api import dump_stacks
from rankscope.models.core import StacksReport, VerdictKind
from rankscope.options import DumpOptions
from rankscope.runtime import procfs
from tests.jobs import JobFactory, RunningJob, run_cli, wait_for

pytestmark = pytest.mark.slow

READY_S = 180.0
HANG_KINDS = set(get_args(VerdictKind)) - set(PROGRESS_KINDS)


def _until(pid: int, kind: str, timeout: float = 90.0) -> StacksReport:
    """Capture until the verdict is ``kind``; every report seen on the way must not call the job hung."""
    seen: list[StacksReport] = []

    def ok() -> bool:
        seen.append(dump_stacks(pid))
        return seen[-1].verdict.kind == kind

    try:
        wait_for(ok, timeout, f"a {kind} verdict", interval=0.2)
    except TimeoutError:
        raise AssertionError(f"last verdicts: {[r.verdict.summary for r in seen[-3:]]}") from None
    return seen[-1]


def test_a_healthy_job_is_never_called_hung(jobs: JobFactory, pyspy_works: str) -> None:
    """Two ranks train flat out: every look says progressing, with counters moving on both."""
    job = jobs.torchrun("progress_jobs.py", nproc=2, args=["--mode", "healthy"])
    job.wait_ready(timeout=READY_S)
    for _ in range(3):
        report = dump_stacks(job.pid)
        assert report.verdict.kind == "progressing", report.verdict.summary
        assert report.verdict.suspect_ranks == [] and report.verdict.confidence == "high"
        progress = report.progress
        assert progress is not None and progress.motion == "moving" and progress.straggler is None
        assert "step" in progress.summary and "on every rank" in progress.summary
        assert {r.rank for r in progress.ranks} == {0, 1}
        assert all(r.counters and r.cpu_pct is not None and r.samples > 0 for r in progress.ranks)
    # the CLI: --window sets how long, the answer leads with the progress verdict
    code_out = run_cli("stacks", "--pid", str(job.pid), "--window", "0.5", "--json")
    assert code_out.returncode == 0, code_out.stderr
    data = json.loads(code_out.stdout)
    assert data["verdict"]["kind"] == "progressing" and data["progress"]["motion"] == "moving"
    assert 0.5 <= data["progress"]["window_s"] < 5
    text = run_cli("stacks", "--pid", str(job.pid))
    assert "progress over" in text.stdout and "verdict: progressing" in text.stdout
    # one look is what a window of zero asks for; a negative window is refused
    assert dump_stacks(job.pid, DumpOptions(window=0)).progress is None
    bad = run_cli("stacks", "--pid", str(job.pid), "--window", "-1")
    assert bad.returncode == 2 and "--window" in bad.stderr


@contextlib.contextmanager
def _starving(slow: int, fast: int) -> Iterator[None]:
    """Pin process ``slow`` to a core that a spinning process shares with it, weighted ten to one
    against the job (the job's scheduler group at nice 10), and ``fast`` to a core of its own:
    ``slow`` queues for its core, as a rank does on a host whose cores other work takes."""
    cpus = sorted(os.sched_getaffinity(0))
    group = Path(f"/proc/{slow}/autogroup")
    spinner = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpus[0]}}})\nwhile True: pass"],
        start_new_session=True,
    )
    try:
        for pid, cpu in ((slow, cpus[0]), (fast, cpus[-1])):
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), {cpu})
                if not group.exists():  # no scheduler groups: each thread's own weight
                    os.setpriority(os.PRIO_PROCESS, int(tid), 10)
        if group.exists():
            group.write_text("10")
        yield
    finally:
        spinner.kill()
        spinner.wait(timeout=30)
        if group.exists():
            group.write_text("0")


def _rank_pid(job: RunningJob, rank: int) -> int:
    for pid in job.rank_pids():
        environ = procfs.read_environ(pid) or {}
        if environ.get("RANK") == str(rank) and any("progress_jobs" in w for w in procfs.read_cmdline(pid)):
            return pid
    raise AssertionError(f"no rank {rank} among {job.rank_pids()}")


def test_a_rank_the_host_starves_of_cpu_is_not_a_straggler(jobs: JobFactory, pyspy_works: str) -> None:
    """Both ranks do the same work; rank 0 shares its core with other work that outweighs it, rank 1
    has a core of its own. Rank 0 waits less in all_reduce only because it queues for its core: the
    job is progressing, nobody is named, and the summary says the lag is the host's."""
    job = jobs.torchrun("progress_jobs.py", nproc=2, args=["--mode", "healthy", "--side", "256"])
    job.wait_ready(timeout=READY_S)
    seen: list[StacksReport] = []

    def lagging() -> bool:
        seen.append(dump_stacks(job.pid))
        verdict, progress = seen[-1].verdict, seen[-1].progress
        # never hung and never a straggler; a step longer than the window (a core shared with the
        # rest of a loaded host too) may read as busy, which says the rank queued for its core
        assert verdict.kind in ("progressing", "busy") and progress is not None, verdict.summary
        if verdict.kind == "busy":
            assert verdict.suspect_ranks in ([], [0]), verdict  # only the rank that computes
            return False
        waits = {r.rank: r.waiting_pct or 0 for r in progress.ranks}
        return waits.get(1, 0) - waits.get(0, 100) >= STRAGGLER_GAP_PCT

    with _starving(_rank_pid(job, 0), _rank_pid(job, 1)):
        wait_for(lagging, 90, "rank 0 to wait less than rank 1", interval=0.2)
    progress = seen[-1].progress
    assert progress is not None and progress.straggler is None and seen[-1].verdict.suspect_ranks == []
    starved = next(r for r in progress.ranks if r.rank == 0)
    assert starved.queued_pct is not None and starved.queued_pct >= 30, progress.ranks
    assert "rank 0 waits less" in progress.summary and "queued for a core" in progress.summary


def test_a_straggler_is_named_with_where_its_time_goes(jobs: JobFactory, pyspy_works: str) -> None:
    """Rank 2's images are 16x wider: each step it decodes while ranks 0 and 1 wait in all_reduce
    (two others, so the straggler is told from more than one peer)."""
    job = jobs.torchrun("progress_jobs.py", nproc=3, args=["--mode", "straggler", "--odd", "2"])
    job.wait_ready(timeout=READY_S)
    report = _until(job.pid, "straggler")
    assert report.verdict.suspect_ranks == [2]
    assert "load_batch" in report.verdict.summary and "not hung" in report.verdict.summary
    progress = report.progress
    assert progress is not None and progress.straggler == 2
    rank2 = next(r for r in progress.ranks if r.rank == 2)
    others = [r for r in progress.ranks if r.rank != 2]
    assert rank2.waiting_pct is not None and all((r.waiting_pct or 0) > rank2.waiting_pct for r in others)
    assert rank2.hot and "load_batch" in rank2.hot[0]
    step = report.verdict.next_steps[1]
    assert step.tool == "dump_stacks" and step.args is not None and step.args["full_ranks"][0] == 2


def test_a_long_evaluation_on_one_rank_is_busy_not_hung(jobs: JobFactory, pyspy_works: str) -> None:
    """Rank 0 evaluates for an hour in its own code while ranks 1-2 wait in barrier()."""
    job = jobs.torchrun("progress_jobs.py", nproc=3, args=["--mode", "busy", "--odd", "0"])
    job.wait_ready(timeout=READY_S)
    report = _until(job.pid, "busy")
    verdict = report.verdict
    assert verdict.suspect_ranks == [0] and verdict.confidence == "medium"
    assert "ranks 1-2 wait in barrier" in verdict.summary and "evaluate" in verdict.summary
    assert "deadlock" in verdict.summary  # "not a deadlock as far as this window shows"
    assert report.progress is not None and report.progress.motion == "no_progress"
    look_again = verdict.next_steps[0]
    assert look_again.tool == "dump_stacks" and look_again.args is not None
    assert look_again.args["window_s"] >= 10


def test_every_rank_computing_in_its_own_code_is_not_hung(jobs: JobFactory, pyspy_works: str) -> None:
    """No collective anywhere, every rank in one long CPU loop: the job computes, nobody is blocked."""
    job = jobs.torchrun("progress_jobs.py", nproc=2, args=["--mode", "spin"])
    job.wait_ready(timeout=READY_S)
    report = _until(job.pid, "progressing")
    assert report.verdict.suspect_ranks == []
    assert "evaluate" in report.verdict.summary


def test_the_recorder_is_read_at_both_ends_where_the_job_opened_a_channel(
    jobs: JobFactory, pyspy_works: str, tmp_path: object
) -> None:
    """rankscope.probe's flight recorder is on: a dump is asked for at each end of the window, and
    each rank's completed collectives are one more sign of motion."""
    from pathlib import Path

    from rankscope.analysis.hang.progress import RECORDER_KEY

    dumps = Path(str(tmp_path)) / "fr"
    job = jobs.torchrun("progress_jobs.py", nproc=2, args=["--mode", "healthy", "--probe", str(dumps)])
    job.wait_ready(timeout=READY_S)
    report = _until(job.pid, "progressing")
    progress = report.progress
    assert progress is not None
    moved = [r.counters[RECORDER_KEY] for r in progress.ranks if RECORDER_KEY in r.counters]
    assert len(moved) == 2 and all(after > before for before, after in moved), progress.ranks
    assert job.proc.poll() is None  # asked twice for a dump, still training
