"""One host's capture (the local call, a host's ``--local``), inside ``procfs.reading_once()``, reads each rank's stable /proc facts once:
discovery, the redactor, the backend and GPU readers, the recorder pickup and the debug-server check
all ask, and each rank's fd folder is listed once and its environ read once (a real gloo job)."""

from __future__ import annotations

from collections import Counter

import pytest

from rankscope.capabilities.stacks import dump_stacks, look_here
from rankscope.options import DumpOptions
from tests.jobs import JobFactory, wait_for
from tests.unit.test_procfs_once import count_reads

pytestmark = pytest.mark.slow

READY_S = 180.0
"""Readiness can take long when the 2 cores are shared: every rank imports torch."""


def test_one_capture_lists_each_ranks_fds_and_reads_its_environ_once(
    jobs: JobFactory, pyspy_works: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = jobs.torchrun("hang_collectives.py", nproc=2, args=["--mode", "idle"])
    job.wait_ready(timeout=READY_S)
    wait_for(lambda: len(job.rank_pids()) >= 2, READY_S, "2 ranks")
    reads = count_reads(monkeypatch)
    report = dump_stacks(job.pid, DumpOptions(window=0))  # the local call opens the scope itself
    ranks = sorted(s.pid for s in report.stacks)
    assert len(ranks) == 2 and all(s.threads for s in report.stacks), report.errors
    _once(reads, ranks)
    reads.clear()
    look = look_here(job.pid, DumpOptions(window=0))  # and so does a host's --local
    assert sorted(s.pid for s in look.stacks) == ranks
    _once(reads, ranks)


def _once(reads: Counter[tuple[int, str]], ranks: list[int]) -> None:
    for pid in ranks:
        assert reads[(pid, "fd")] == 1, (pid, reads[(pid, "fd")])
        assert reads[(pid, "environ")] == 1, (pid, reads[(pid, "environ")])
        assert reads[(pid, "stat")] >= 1  # the facts of a moment are read as often as asked
