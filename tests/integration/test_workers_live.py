"""Following a suspect into its DataLoader workers, on live processes.

A 3-rank gloo job whose rank 2 reads a shard that is a named pipe with no writer: its worker's
``open()`` never returns, so rank 2 waits in the DataLoader while ranks 0-1 all-reduce. One
``dump_stacks`` names rank 2, its worker's own line, and the FIFO it waits on. The kernel-wait
reader is checked alone too, on a plain process blocked opening a FIFO and one reading a pipe.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.runtime.kernel_wait import kernel_wait
from rankscope.runtime.proctree import reap_tree
from tests.jobs import PROGRAMS, JobFactory, wait_for
from tests.live_stacks import READY_S, settle

pytestmark = pytest.mark.slow


def test_a_rank_waiting_on_its_dataloader_is_named_with_its_workers_wait(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path
) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    for r in (0, 1):
        (shards / f"shard{r}").write_bytes(b"abcd")
    os.mkfifo(shards / "shard2")
    job = jobs.torchrun("hang_loader_fifo.py", nproc=3, args=["--shards", str(shards), "--odd", "2"])
    fed = jobs.torchrun("hang_loader_fifo.py", nproc=3, args=["--shards", str(shards), "--feeder", "thread"])
    job.wait_ready(["rank0", "rank1"], timeout=READY_S)
    report = settle(
        job.pid, lambda r: r.verdict.suspect_ranks == [2] and "DataLoader worker" in r.verdict.summary
    )
    v = report.verdict
    assert (
        "rank 2 is in no collective" in v.summary and "blocked in _BaseDataLoaderIter.__next__" in v.summary
    )
    assert "rank 2's DataLoader worker (pid " in v.summary, v.summary
    line = next(
        i
        for i, t in enumerate((PROGRAMS / "hang_loader_fifo.py").read_text().splitlines(), 1)
        if "with open(self.path" in t
    )
    assert (
        f"waits at hang_loader_fifo.py:{line} in ShardDataset.__getitem__ (`with open(self.path" in v.summary
    )
    assert f"in the kernel at wait_for_partner (openat {shards / 'shard2'}, a FIFO (named pipe)" in v.summary
    assert any(line.startswith("rank 2's DataLoader worker") for line in v.evidence)
    assert v.next_steps[0].action.startswith("Fix what the worker (or thread) the evidence names waits on")

    # the same shard read by a thread of the rank into a queue its main thread waits on
    fed.wait_ready(["rank0", "rank1"], timeout=READY_S)
    report = settle(
        fed.pid, lambda r: r.verdict.suspect_ranks == [2] and "thread reader" in r.verdict.summary
    )
    v = report.verdict
    assert "rank 2's thread reader (tid " in v.summary, v.summary
    assert (
        "in ShardDataset.__getitem__ (`with open(self.path" in v.summary and "wait_for_partner" in v.summary
    )


def _blocked(code: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A plain Python process running ``code`` (it blocks), started in its own session."""
    return subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, start_new_session=True)


def test_kernel_wait_reads_the_fifo_an_open_blocks_on_and_the_pipe_a_read_waits_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    opener = _blocked(f"open({str(fifo)!r}, 'rb')", tmp_path)
    reader = _blocked("import os, sys; r, w = os.pipe(); os.read(r, 1)", tmp_path)
    try:
        wait_for(lambda: kernel_wait(opener.pid).wchan == "wait_for_partner", 30, "the open to block")
        w = kernel_wait(opener.pid)
        assert w.syscall in ("openat", "open") and w.path == str(fifo) and w.kind == "fifo", w
        wait_for(lambda: kernel_wait(reader.pid).kind == "pipe", 30, "the read to block")
        r = kernel_wait(reader.pid)
        assert r.syscall == "read" and r.path is not None and r.path.startswith("pipe:"), r
    finally:
        for proc in (opener, reader):
            reap_tree(proc)
