"""A live wait of the suite that runs out says what it waited for and what the job last printed,
instead of a bare timeout: the readiness waits of tests/jobs.py, on a real process."""

from __future__ import annotations

import sys

import pytest

from tests.jobs import JobFactory, wait_for

STUCK = "import time; print('rank 0: loading the dataset', flush=True); time.sleep(120)"


def test_a_readiness_wait_that_runs_out_names_the_missing_files_and_the_last_output(jobs: JobFactory) -> None:
    job = jobs.start([sys.executable, "-c", STUCK], nproc=1, port=0)
    wait_for(lambda: "loading" in job.output(), 60, "the program's first line", detail=job.last_output)
    with pytest.raises(TimeoutError) as info:
        job.wait_ready(["rank0"], timeout=0.5)
    message = str(info.value)
    assert message.startswith("waited 0 s for the ranks' readiness files in "), message
    assert "still missing ['rank0'] (have [])" in message
    assert "is still running; its last output:\nrank 0: loading the dataset" in message


def test_an_exit_wait_that_runs_out_says_what_it_waited_for(jobs: JobFactory) -> None:
    job = jobs.start([sys.executable, "-c", STUCK], nproc=1, port=0)
    wait_for(lambda: "loading" in job.output(), 60, "the program's first line")
    with pytest.raises(
        TimeoutError, match=r"waited 0 s for the job to finish; the job \(pid \d+\) is still running"
    ):
        job.wait_exit(0.2, "the job to finish")
