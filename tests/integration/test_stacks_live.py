"""rankscope on real hung gloo jobs: discovery, concurrent capture, verdicts, the CLI.

Every job is started through the ``jobs`` fixture (reaped at teardown, pass or fail).
A readiness file is written just before a rank enters its blocking call, so each test
polls the stacks until the expected verdict shows instead of assuming it (tests/live_stacks.py).
A job several tests only read is started once for the module (``module_jobs``).
Subgroup hangs and a loop in an installed library are in test_stacks_subgroups_live.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections import Counter

import pytest

from rankscope.analysis.hang.stacks import analyze
from rankscope.api import dump_stacks, find_job, list_jobs
from rankscope.capabilities.stacks import SAME_DUMP_COUNTERS, capture_job, counter_pass, look_here
from rankscope.models.core import StacksReport
from rankscope.options import DEFAULTS, DumpOptions
from rankscope.runtime.proctree import descendants
from rankscope.runtime.pyspy import check_pyspy
from tests.jobs import PROGRAMS, JobFactory, RunningJob, wait_for
from tests.live_stacks import READY_S, run_cli, settle
from tests.unit.test_procfs_once import count_reads

pytestmark = pytest.mark.slow

SECRET = "hunter2-very-secret-value"
CLI_SECRET = "cli-secret-0123456789"


def rank_pids(job: RunningJob, n: int) -> list[int]:
    pids: list[int] = []

    def found() -> bool:
        pids[:] = [r.pid for r in find_job(job.pid).ranks]
        return len(pids) == n

    wait_for(found, READY_S, f"{n} ranks")
    return pids


def test_mismatched_collectives_torchrun(jobs: JobFactory, pyspy_works: str) -> None:
    job = jobs.torchrun(
        "hang_collectives.py",
        nproc=3,
        args=["--mode", "mismatch", "--odd", "2", "--loader", f"--api-key={CLI_SECRET}"],
        env={"HANG_SECRET_TOKEN": SECRET},
    )
    job.wait_ready(timeout=READY_S)
    report = settle(job.pid, lambda r: r.verdict.kind == "mismatched_collectives")
    assert report.verdict.suspect_ranks == [2]
    assert "rank 2 waits in barrier at hang_collectives.py:" in report.verdict.summary
    assert "ranks 0-1 wait in all_reduce" in report.verdict.summary
    found = report.job
    assert found.launcher == "torchrun" and found.launcher_pid == job.pid and found.world_size == 3
    assert [r.rank for r in found.ranks] == [0, 1, 2] and found.missing_ranks == []
    # DataLoader worker: a child of rank 0 that inherited RANK, never a rank itself
    rank0 = found.ranks[0]
    rank_set = {r.pid for r in found.ranks}
    assert rank0.children and not set(rank0.children) & rank_set
    # every pid of the job resolves to the same job: launcher, a rank, the worker
    for pid in (found.ranks[1].pid, rank0.children[0]):
        assert find_job(pid).job_id == found.job_id
    by_rank = dump_stacks(found.ranks[1].pid, DumpOptions(nonblocking=True))
    assert by_rank.verdict.kind == "mismatched_collectives" and by_rank.verdict.suspect_ranks == [2]
    assert any(j.job_id == found.job_id for j in list_jobs().jobs)

    # locals and command lines are redacted; the secret never leaves
    with_locals = dump_stacks(job.pid, DumpOptions(locals=True))
    text = with_locals.model_dump_json()
    assert SECRET not in text and CLI_SECRET not in text
    assert "<redacted>" in text
    main_frames = [
        f
        for s in with_locals.stacks
        for t in s.threads
        if t.is_main
        for f in t.frames
        if f.function == "main"
    ]
    assert main_frames and all(f.locals for f in main_frames)

    # the CLI: human view, JSON, ps
    code, out, _ = run_cli("stacks", "--pid", str(job.pid))
    assert code == 0
    assert (
        "== ranks 0-1 (2): all_reduce at" in out
        and "verdict: mismatched_collectives (suspects: rank 2)" in out
    )
    code, out, _ = run_cli("stacks", "--pid", str(job.pid), "--json", "--show-rank", "2")
    data = json.loads(out)
    assert code == 0 and [s["rank"] for s in data["stacks"]] == [2] and data["stacks"][0]["threads"]
    assert len(out) <= 8_000 and next(iter(data)) == "verdict"  # bounded and compact by default
    code, out, _ = run_cli("stacks", "--pid", str(job.pid), "--json", "--full", "--show-rank", "2")
    data = json.loads(out)
    assert {"world_size", "ranks", "missing_ranks"} <= set(data["job"]) and {
        "kind",
        "suspect_ranks",
        "summary",
        "next_steps",
    } <= set(data["verdict"])
    code, out, _ = run_cli("ps", "--pid", str(found.ranks[2].pid), "--json")
    assert code == 0 and json.loads(out)["jobs"][0]["job_id"] == found.job_id
    code, out, _ = run_cli("ps")
    assert code == 0 and found.job_id in out and CLI_SECRET not in out


def test_queue_blocked_and_stopped_ranks_are_divergent(jobs: JobFactory, pyspy_works: str) -> None:
    job = jobs.torchrun(
        "hang_collectives.py", nproc=3, args=["--mode", "divergent", "--odd", "1", "--stop", "2"]
    )
    job.wait_ready(timeout=READY_S)
    pids = rank_pids(job, 3)
    try:
        # attach by a rank pid this time
        report = settle(
            pids[0],
            lambda r: r.verdict.kind == "divergent_ranks" and r.verdict.suspect_ranks == [1, 2],
        )
        assert "rank 2 is stopped" in report.verdict.summary
        assert "Queue.get" in report.verdict.summary
        states = {s.rank: s.state for s in report.stacks}
        assert states[2] == "stopped"
        assert not next(s for s in report.stacks if s.rank == 2).threads  # never ptraced
        assert report.errors == []
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)


def test_spawn_job_ranks_come_from_the_spawn_index(jobs: JobFactory, pyspy_works: str) -> None:
    job = jobs.python("hang_spawn.py", nproc=2, args=["--nproc", "2", "--odd", "1"])
    job.wait_ready(timeout=READY_S)
    report = settle(job.pid, lambda r: {g.op for g in r.groups} == {"all_reduce", "barrier"})
    found = report.job
    assert found.launcher == "mp_spawn" and found.launcher_pid == job.pid
    assert found.world_size == 2  # read from the parent's start_processes(nprocs=...)
    assert [(r.rank, r.rank_source) for r in found.ranks] == [(0, "spawn_index"), (1, "spawn_index")]
    assert report.verdict.kind == "mismatched_collectives"
    barrier = next(g for g in report.groups if g.op == "barrier")
    assert barrier.ranks == [1] and barrier.call_site and barrier.call_site.function == "worker"
    # rank 0's forked DataLoader worker has a rank's command line but is its child
    # (and the resource tracker, another child of the parent, is no rank either)
    worker = found.ranks[0].children
    assert worker and not set(worker) & {r.pid for r in found.ranks}
    assert {r.pid for r in found.ranks} < set(descendants(job.pid))
    # locals were read for the index but not handed out unasked
    assert all(f.locals is None for s in report.stacks for t in s.threads for f in t.frames)


def test_all_in_same_collective_and_ranks_that_never_came(jobs: JobFactory, pyspy_works: str) -> None:
    same = jobs.torchrun("hang_collectives.py", nproc=2, args=["--mode", "p2p"])
    partial = jobs.python("hang_envlaunch.py", nproc=2, args=["--world", "3", "--started", "2"])
    ring = jobs.torchrun("hang_collectives.py", nproc=3, args=["--mode", "same"])
    same.wait_ready(timeout=READY_S)
    partial.wait_ready(timeout=READY_S)
    ring.wait_ready(timeout=READY_S)
    report = settle(same.pid, lambda r: r.verdict.kind == "all_in_same_collective")
    # irecv(...).wait(): a C++ wait right under the user's line, read from the source line
    assert {g.op for g in report.groups} == {"Work.wait"} and report.verdict.suspect_ranks == []
    assert all(s.op_evidence and "req.wait()" in s.op_evidence for s in report.stacks)
    # every rank in recv(src=rank+1): a second dump with locals reads each peer, and the cycle is named
    report = settle(ring.pid, lambda r: {s.op for s in r.stacks} == {"recv"})
    assert report.verdict.kind == "all_in_same_collective"
    assert [(s.rank, s.peer) for s in report.stacks] == [(0, 1), (1, 2), (2, 0)]
    assert "ranks 0, 1, 2 wait on each other in a cycle" in report.verdict.summary
    assert all(f.locals is None for s in report.stacks for t in s.threads for f in t.frames)  # not asked for
    code, out, _ = run_cli("stacks", "--pid", str(ring.pid), "--locals", "--json", "--full")
    assert code == 0
    ringed = StacksReport.model_validate_json(out)
    assert [(s.rank, s.peer) for s in ringed.stacks] == [(0, 1), (1, 2), (2, 0)]
    assert any(f.locals for s in ringed.stacks for t in s.threads for f in t.frames)
    report = settle(partial.pid, lambda r: {s.op for s in r.stacks} == {"init_process_group"})
    assert report.job.launcher == "env" and report.job.world_size == 3
    # every rank that runs waits before its first collective: a start-up, naming the rank never started
    assert report.verdict.kind == "startup" and report.verdict.suspect_ranks == [2]
    code, out, _ = run_cli("stacks", "--pid", str(partial.pid), "--brief")
    assert code == 0 and out.startswith("verdict: startup, confidence medium; suspects: rank 2\n"), out


@pytest.fixture(scope="module")
def idle_job(module_jobs: JobFactory) -> RunningJob:
    """Two ranks that never communicate, each waiting on an Event for good once ready. The tests
    below only read it (stacks, /proc, a native dump that pauses the ranks for a moment), so either
    may run first."""
    job = module_jobs.torchrun("hang_collectives.py", nproc=2, args=["--mode", "idle"])
    job.wait_ready(timeout=READY_S)
    return job


def test_no_collective(idle_job: RunningJob, pyspy_works: str) -> None:
    job = idle_job
    report = settle(job.pid, lambda r: all(s.threads for s in r.stacks) and r.verdict.kind == "no_collective")
    assert "Event.wait" in report.verdict.summary
    # with native frames: the same reading, and C frames under the Python ones
    native = dump_stacks(job.pid, DumpOptions(native=True, timeout=60))
    assert native.verdict.kind == "no_collective"
    assert all(any(f.native for t in s.threads for f in t.frames) for s in native.stacks)


def test_one_capture_lists_each_ranks_fds_and_reads_its_environ_once(
    idle_job: RunningJob, pyspy_works: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One host's capture (the local call, a host's ``--local``), inside ``procfs.reading_once()``,
    reads each rank's stable /proc facts once: discovery, the redactor, the backend and GPU readers,
    the recorder pickup and the debug-server check all ask, and each rank's fd folder is listed once
    and its environ read once. Nothing is kept outside the scope, so an earlier capture of the same
    job (another test's) does not change the count."""
    job = idle_job
    wait_for(lambda: len(job.rank_pids()) >= 2, READY_S, "2 ranks")
    reads = count_reads(monkeypatch)
    report = dump_stacks(job.pid, DumpOptions(window=0))  # the local call opens the scope itself
    ranks = sorted(s.pid for s in report.stacks)
    assert len(ranks) == 2 and all(s.threads for s in report.stacks), report.errors
    _read_once(reads, ranks)
    reads.clear()
    look = look_here(job.pid, DumpOptions(window=0))  # and so does a host's --local
    assert sorted(s.pid for s in look.stacks) == ranks
    _read_once(reads, ranks)


def _read_once(reads: Counter[tuple[int, str]], ranks: list[int]) -> None:
    for pid in ranks:
        assert reads[(pid, "fd")] == 1, (pid, reads[(pid, "fd")])
        assert reads[(pid, "environ")] == 1, (pid, reads[(pid, "environ")])
        assert reads[(pid, "stat")] >= 1  # the facts of a moment are read as often as asked


@pytest.fixture(scope="module")
def async_job(module_jobs: JobFactory) -> RunningJob:
    """NCCL's CPU shape on gloo: rank 1 lags at step 3, the others ran on to step 11 and wait in
    work.wait() there. Hung for good once ready; the tests below only read it."""
    job = module_jobs.torchrun("hang_collectives.py", nproc=3, args=["--mode", "async", "--odd", "1"])
    job.wait_ready(timeout=READY_S)
    return job


def test_async_collectives_lagging_counter_names_the_laggard(async_job: RunningJob, pyspy_works: str) -> None:
    """NCCL's CPU shape on gloo: the others ran on to step 11 and wait in work.wait() there."""
    job = async_job
    report = settle(job.pid, lambda r: r.verdict.suspect_ranks == [1])
    v = report.verdict
    assert v.confidence == "high" and report.job.backend == "gloo"
    by = {s.rank: s for s in report.stacks}
    assert by[0].op == "Work.wait" and by[2].op == "Work.wait"
    assert by[1].wait == "other"
    # the window's last look gave the counters at no cost; sure already, the answer does not repeat them
    assert not any(line.startswith("progress counter") for line in v.evidence)
    # the second pass itself, on the live ranks: integers only, and the counter names the laggard
    found = find_job(job.pid)
    found, stacks, errors = capture_job(found)
    with_counters = counter_pass(stacks, found.ranks, check_pyspy(), DEFAULTS)
    assert {s.rank: s.counters.get("hang_collectives.py:run_async:step") for s in with_counters} == {
        0: 11,
        1: 3,
        2: 11,
    }
    assert all(f.locals is None for s in with_counters for t in s.threads for f in t.frames)
    again = analyze(found, with_counters, errors)
    # they name the rank the stacks already named, surely: the answer does not repeat them
    assert again.verdict.suspect_ranks == [1] and again.verdict.confidence == "high"
    assert not any("step=3" in e for e in again.verdict.evidence)
    # a single --native look reads the same counters from its own dumps (taken with locals), no second pass
    native = dump_stacks(job.pid, DumpOptions(native=True, window=0, timeout=60))
    assert {s.rank: s.counters.get("hang_collectives.py:run_async:step") for s in native.stacks} == {
        0: 11,
        1: 3,
        2: 11,
    }
    assert SAME_DUMP_COUNTERS in native.job.notes and native.verdict.suspect_ranks == [1]
    assert all(f.locals is None for s in native.stacks for t in s.threads for f in t.frames)


def test_counters_come_from_the_locals_already_asked_for(async_job: RunningJob, pyspy_works: str) -> None:
    job = async_job
    report = settle(job.pid, lambda r: r.verdict.suspect_ranks == [1], options=DumpOptions(locals=True))
    assert report.stacks[1].counters.get("hang_collectives.py:run_async:step") == 3
    assert "progress counters read in a second pass" not in " ".join(report.job.notes)


def test_even_split_is_decided_by_the_rank_condition_above_the_call(
    jobs: JobFactory, pyspy_works: str
) -> None:
    """Two ranks, two collectives: no majority, but rank 1's barrier sits under `if ... rank == a.odd:`.
    Started from tests/programs, a neutral folder: test_folder_names_live.py starts the same job from
    folders named like rankscope's or torch's and expects what this test asserts."""
    job = jobs.torchrun("hang_collectives.py", nproc=2, args=["--mode", "mismatch", "--odd", "1"])
    job.wait_ready(timeout=READY_S)
    report = settle(
        job.pid, lambda r: r.verdict.kind == "mismatched_collectives" and r.verdict.suspect_ranks == [1]
    )
    v = report.verdict
    assert v.confidence == "medium"
    assert (
        '`if a.mode == "mismatch" and rank == a.odd:` guards the barrier at hang_collectives.py:' in v.summary
    )
    sites = {s.rank: s.call_site for s in report.stacks}
    program = str(PROGRAMS / "hang_collectives.py")
    assert all(site is not None and site.file == program for site in sites.values()), sites
