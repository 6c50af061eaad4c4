"""A job's own code is the job's, whatever its folder is called (issue 41).

The same real gloo jobs, their program copied into a folder named ``rankscope``, ``torch`` or
``site-packages-notes`` and started from there, get the verdicts they get from a neutral folder: a
healthy loop is progressing (its counters read), a hung one is named with its guard. Frames are
told apart by where the rank imports its code from, never by a word in their path. Jobs are
reaped by the ``jobs`` fixture, pass or fail.

The neutral folder's verdicts are asserted where those jobs run from tests/programs:
test_progress_live.py's healthy job and test_stacks_live.py's even split (with its call sites'
file). A neutral copy here would start two more jobs to assert nothing new.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rankscope.api import dump_stacks
from rankscope.models.core import StacksReport
from tests.jobs import PROGRAMS, JobFactory, RunningJob, free_port, wait_for

pytestmark = pytest.mark.slow

READY_S = 180.0
FOLDERS = ("rankscope", "torch", "site-packages-notes")


def start_in(jobs: JobFactory, folder: Path, program: str, args: list[str]) -> RunningJob:
    """torchrun with 2 ranks of a copy of ``tests/programs/<program>`` in ``folder``, started there."""
    folder.mkdir(parents=True)
    shutil.copy(PROGRAMS / program, folder / program)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "--monitor_interval=0.2",
        str(folder / program),
        *args,
    ]
    job = jobs.start(argv, nproc=2, port=port, tag=folder.name, cwd=folder)
    job.wait_ready(timeout=READY_S)
    return job


def settle(pid: int, until: Callable[[StacksReport], bool], timeout: float = 90.0) -> StacksReport:
    """Capture until ``until(report)`` holds (ranks may still be on their way to where the test wants them)."""
    box: list[StacksReport] = []

    def ok() -> bool:
        box[:] = [dump_stacks(pid)]
        return until(box[0])

    try:
        wait_for(ok, timeout, "the expected verdict", interval=0.3)
    except TimeoutError:
        raise AssertionError(f"last verdict: {box[0].verdict if box else None}") from None
    return box[0]


@pytest.mark.parametrize("name", FOLDERS)
def test_a_healthy_job_is_progressing_from_any_folder(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path, name: str
) -> None:
    job = start_in(jobs, tmp_path / name, "progress_jobs.py", ["--mode", "healthy"])
    report = dump_stacks(job.pid)
    v, progress = report.verdict, report.progress
    assert v.kind == "progressing" and v.confidence == "high" and v.suspect_ranks == [], v.summary
    assert progress is not None and progress.motion == "moving" and "step" in progress.summary
    assert all(r.counters for r in progress.ranks), [r.counters for r in progress.ranks]


@pytest.mark.parametrize("name", FOLDERS)
def test_a_hung_job_is_named_with_its_guard_from_any_folder(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path, name: str
) -> None:
    """Rank 1 waits in a barrier under ``if ... rank == a.odd:``, rank 0 in all_reduce."""
    here = tmp_path / name
    job = start_in(jobs, here, "hang_collectives.py", ["--mode", "mismatch", "--odd", "1"])
    report = settle(job.pid, lambda r: r.verdict.kind == "mismatched_collectives")
    v = report.verdict
    assert v.suspect_ranks == [1] and v.confidence == "medium", v.summary
    assert (
        '`if a.mode == "mismatch" and rank == a.odd:` guards the barrier at hang_collectives.py:' in v.summary
    )
    sites = {s.rank: s.call_site for s in report.stacks}
    assert all(site is not None and site.file == str(here / "hang_collectives.py") for site in sites.values())
