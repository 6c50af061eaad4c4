"""Flight-recorder dumps a live rank already wrote: found from its environment, this run's only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from rankscope.capabilities.recorder import pickup
from rankscope.capabilities.recorder.pickup import dump_path, find_dumps, pick_up
from rankscope.models.core import Job, RankProcess
from rankscope.runtime.procfs import read_environ
from tests.jobs import JobFactory, wait_for
from tests.paths import DATA

DUMPS = DATA / "flight" / "nccl_dtype"


def test_dump_path_follows_torch_rules() -> None:
    assert dump_path(3, {"TORCH_FR_DUMP_TEMP_FILE": "/x/fr_"}) == Path("/x/fr_3")
    assert dump_path(3, {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/y/t"}) == Path("/y/t3")
    assert dump_path(0, {"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/torch/comm_lib_trace_rank_0")
    assert dump_path(1, {"HOME": "/h"}) == Path("/h/.cache/torch/comm_lib_trace_rank_1")
    assert dump_path(1, {}) == Path("/tmp/.cache/torch/comm_lib_trace_rank_1")


SLEEPER = ["-c", "import time; time.sleep(60)"]


@contextmanager
def ranks_with(env: dict[str, str], n: int = 1, argv: list[str] = SLEEPER) -> Iterator[Job]:
    """``n`` live processes carrying ``env`` (the ranks of a job), killed and reaped on the way out."""
    procs = [subprocess.Popen([sys.executable, *argv], env={**os.environ, **env}) for _ in range(n)]
    try:
        yield Job(
            job_id="j",
            world_size=n,
            ranks=[RankProcess(rank=r, pid=p.pid, host="h") for r, p in enumerate(procs)],
        )
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_picks_up_this_runs_dumps_and_ignores_older_ones(tmp_path: Path) -> None:
    stale = tmp_path / "fr_1"
    shutil.copy(DUMPS / "nccl_trace_rank_1", stale)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    with ranks_with({"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_")}, n=4) as job:
        for rank in (0, 2, 3):  # written after the ranks started: this run's
            fresh = tmp_path / f"fr_{rank}"
            shutil.copy(DUMPS / f"nccl_trace_rank_{rank}", fresh)
            now = time.time() + 1.0  # clearly after every rank's start, however loaded the machine
            os.utime(fresh, (now, now))
        for r in job.ranks:  # every rank's environment is readable before it is looked up
            wait_for(lambda r=r: "TORCH_FR_DUMP_TEMP_FILE" in (read_environ(r.pid) or {}), 30, "environ")
        assert sorted(p.name for p in find_dumps(job)) == ["fr_0", "fr_2", "fr_3"]
        report = pick_up(job)
        assert report is not None and report.ranks == [0, 2, 3]


def test_no_dumps_no_report(tmp_path: Path) -> None:
    with ranks_with({"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_")}) as job:
        assert pick_up(job) is None


FAKE_MONITOR = r"""
import os, shutil, sys, time
stem, src, dst, ready = sys.argv[1:5]
pipe = stem + "0.pipe"
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # as NCCL's heartbeat monitor opens it
open(ready, "w").close()
while True:
    try:
        data = os.read(fd, 16)
    except BlockingIOError:
        data = b""
    if data:
        shutil.copy(src, dst + "0")
    time.sleep(0.2)
"""


def test_a_rank_that_opened_a_debug_pipe_is_asked_for_a_dump(tmp_path: Path) -> None:
    stem, fr = str(tmp_path / "pipe_"), str(tmp_path / "fr_")
    ready = tmp_path / "ready"
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem, "TORCH_FR_DUMP_TEMP_FILE": fr}
    argv = ["-c", FAKE_MONITOR, stem, str(DUMPS / "nccl_trace_rank_0"), fr, str(ready)]
    with ranks_with(env, argv=argv) as job:
        wait_for(ready.exists, 30, "the fake monitor's pipe")
        assert find_dumps(job) == []  # nothing written yet
        report = pick_up(job)
        assert report is not None and report.ranks == [0]
        assert pick_up(job, ask=False) is not None  # now it is there to pick up


def test_no_pipe_no_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"waited {seconds} s with no pipe to ask through")

    monkeypatch.setattr(pickup, "time", SimpleNamespace(sleep=no_sleep, monotonic=time.monotonic))
    with ranks_with({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "none_")}) as job:
        assert pick_up(job) is None


def _probed_rank(tmp_path: Path) -> tuple[Job, dict[int, pickup.Probe]]:
    """This process as rank 0 of a job, with a probe dumping to ``tmp_path`` (the asking is faked)."""
    job = Job(job_id="j", world_size=1, ranks=[RankProcess(rank=0, pid=os.getpid(), host="h")])
    return job, {os.getpid(): pickup.Probe(dump_dir=tmp_path, signal=12)}


def test_a_probed_rank_still_writing_its_dump_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.13's first recorder dump in a process imports torch._inductor: on a busy host it
    takes longer than a rank gets to answer. The rank's busy file says it took the request."""
    job, probes = _probed_rank(tmp_path)
    busy, trace = probes[os.getpid()].busy(0), probes[os.getpid()].trace(0)

    def write() -> None:
        shutil.copy(DUMPS / "nccl_trace_rank_0", trace)
        busy.unlink()

    def ask(pid: int, probe: pickup.Probe) -> bool:
        busy.write_bytes(b"")  # the rank took the request
        threading.Timer(1.5, write).start()  # and writes for longer than wait_s
        return True

    monkeypatch.setattr(pickup, "_ask_probe", ask)
    got = pickup.request_dumps(job, [], wait_s=0.3, probes=probes, dump_wait_s=60.0)
    assert got == [trace] and not busy.exists()


def test_a_probed_rank_that_never_started_writing_is_given_up_on_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy file left by a killed run is not this request's: only ``wait_s`` is waited, not the
    longer wait of a rank that is writing (nor after a rank stopped writing without a trace)."""
    job, probes = _probed_rank(tmp_path)
    busy = probes[os.getpid()].busy(0)
    busy.write_bytes(b"")  # a leftover
    monkeypatch.setattr(pickup, "_ask_probe", lambda pid, probe: True)
    start = time.monotonic()
    assert pickup.request_dumps(job, [], wait_s=0.3, probes=probes, dump_wait_s=60.0) == []
    assert time.monotonic() - start < 30.0

    def failed(pid: int, probe: pickup.Probe) -> bool:
        busy.write_bytes(b"")
        threading.Timer(0.5, busy.unlink).start()  # done, no trace
        return True

    monkeypatch.setattr(pickup, "_ask_probe", failed)
    start = time.monotonic()
    assert pickup.request_dumps(job, [], wait_s=0.3, probes=probes, dump_wait_s=60.0) == []
    assert time.monotonic() - start < 30.0


def test_exception_dump_is_read_from_the_jobs_store_and_never_written() -> None:
    import sys as _sys
    from datetime import timedelta

    from torch.distributed import TCPStore

    from rankscope.capabilities.recorder.pickup import (
        EXCEPTION_DUMP,
        exception_dump_note,
        read_exception_dump,
    )
    from tests.jobs import free_port

    port = free_port()
    server = TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    job = Job(job_id="j", backend="nccl", master_addr="127.0.0.1", master_port=port)
    assert read_exception_dump("127.0.0.1", port) is None
    assert (
        exception_dump_note(job)
        == f"TCPStore 127.0.0.1:{port}: exception_dump not set (no watchdog timeout yet)"
    )
    assert not server.check([EXCEPTION_DUMP])  # reading did not write it
    server.set(
        EXCEPTION_DUMP, (3).to_bytes(4, _sys.byteorder, signed=True)
    )  # as ProcessGroupNCCL's watchdog does
    assert read_exception_dump("127.0.0.1", port) == 3
    note = exception_dump_note(job)
    assert note is not None and "exception_dump=3: rank 3's watchdog saw a collective time out" in note
    assert exception_dump_note(job.model_copy(update={"backend": "gloo"})) is None
    del server
    assert exception_dump_note(job.model_copy(update={"master_port": free_port()})) is None  # nobody listens


def test_worker_server_sockets_give_the_recorder_of_a_hung_gloo_job(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path
) -> None:
    """Ranks that serve torchelastic's worker handlers on their own socket answer fr_trace_json while
    they hang; stacks analyses those traces with the stacks, and the ranks go on waiting."""
    from rankscope.api import dump_stacks
    from rankscope.capabilities.recorder.pickup import worker_trace

    sockets = tmp_path / "sockets"
    sockets.mkdir()
    job = jobs.torchrun("worker_socket_hang.py", nproc=2, args=[str(sockets)])
    job.wait_ready(["rank0", "rank1"], timeout=90)
    wait_for(lambda: len(list(sockets.glob("worker*.sock"))) == 2, 30, "both worker sockets")
    trace = worker_trace(str(sockets / "worker0.sock"))
    assert trace is not None and trace.get("entries")
    report = dump_stacks(job.pid)
    assert "flight recorder: 2 dump(s) this run wrote, analysed with the stacks" in report.job.notes
    assert report.verdict.suspect_ranks == [1]
    assert job.proc.poll() is None
    assert worker_trace(str(tmp_path / "nobody.sock")) is None


def test_recorder_plan_says_where_when_and_how_from_the_launch_environment() -> None:
    from rankscope.capabilities.recorder.pickup import recorder_plan

    job = Job(job_id="j", backend="nccl", ranks=[RankProcess(rank=0, pid=4242, host="h")])

    def plan(env: dict[str, str]) -> str:
        text = recorder_plan(job, {4242: env})
        assert text is not None
        return text

    default = plan({"HOME": "/h"})
    assert (
        "when its watchdog times out" in default
        and "to /h/.cache/torch/comm_lib_trace_rank_<rank>" in default
    )
    assert (
        "No channel for a dump now was opened" in default and "settings made in code do not show" in default
    )
    piped = plan({"TORCH_FR_DUMP_TEMP_FILE": "/d/fr_", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/p"})
    assert "to /d/fr_<rank>" in piped and "write a byte to /tmp/p<rank>.pipe" in piped
    assert plan({"TORCH_FR_BUFFER_SIZE": "0"}).startswith("The flight recorder is off in this job")
    assert plan({"TORCH_NCCL_BLOCKING_WAIT": "1"}).startswith("TORCH_NCCL_BLOCKING_WAIT=1")
    assert plan({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}).startswith("No dump comes on a timeout")
    assert recorder_plan(job.model_copy(update={"backend": "gloo"}), {4242: {}}) is None
    assert recorder_plan(job, {}) is None
