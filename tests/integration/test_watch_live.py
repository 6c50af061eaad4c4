"""`rankscope watch` beside real 3- and 2-rank gloo jobs (tests/programs/watch_jobs.py), started
after the job and before its stall, detached, reading the folder it leaves once the job is gone, and
`triage` of that folder the morning after (the folder's other nights: test_watch_triage_live.py).

Thresholds are short (options), the jobs' own collective timeouts too; every job is reaped by the
``jobs`` fixture and every watcher is stopped by pid at the end, pass or fail.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from rankscope.analysis.sizing.bound import bound_triage
from rankscope.capabilities import watch_folder as wf
from rankscope.capabilities.judge import judge_look
from rankscope.capabilities.triage import triage_logs
from rankscope.mcp_server import build_server
from rankscope.models.watch import WatchManifest
from rankscope.options import DumpOptions
from rankscope.render.answer import shape_answer
from rankscope.runtime import procfs
from tests.jobs import PROGRAMS, JobFactory, RunningJob, run_cli, wait_for

pytestmark = pytest.mark.slow

READY_S = 180.0
END_S = 150.0
FAST = ["--interval", "0.5", "--stall", "3", "--confirm", "0.5", "--resume", "2"]


@pytest.fixture
def watchers() -> Iterator[list[int]]:
    """Pids of the watchers a test started: stopped (TERM, then KILL) at its end."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            if procfs.is_alive(pid):
                os.kill(pid, signal.SIGTERM)
        for pid in pids:
            try:
                wait_for(lambda p=pid: not procfs.is_alive(p), 10, f"watcher {pid} to stop")
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)


def _start(job: RunningJob, out: Path, watchers: list[int], *extra: str) -> dict[str, Any]:
    done = run_cli("watch", "--pid", str(job.pid), "--out", str(out), "--detach", "--json", *FAST, *extra)
    assert done.returncode == 0, done.stderr
    started: dict[str, Any] = json.loads(done.stdout)
    watchers.append(int(started["watcher_pid"]))
    return started


def _ended(out: Path, job: RunningJob) -> WatchManifest:
    """The watch's manifest once the job ended and the watch said so."""
    job.wait_exit(END_S, "the watched job to end")
    wait_for(
        lambda: wf.read_watch(out).state != "watching",
        60,
        "the watch to see the job end",
        0.2,
        lambda: f"the watch's state: {wf.read_watch(out).state!r}",
    )
    return wf.read_watch(out)


def _job(
    jobs: JobFactory, tmp_path: Path, nproc: int, *args: str, launcher: tuple[str, ...] = ()
) -> RunningJob:
    go = tmp_path / "go"
    if launcher:
        from tests.jobs import free_port, torchrun_argv

        port = free_port()
        argv = torchrun_argv(
            "watch_jobs.py",
            f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            *launcher,
            args=[*args, "--go", str(go)],
        )
        job = jobs.start(argv, nproc, port)
    else:
        job = jobs.torchrun("watch_jobs.py", nproc=nproc, args=[*args, "--go", str(go)])
    job.wait_ready([f"up-rank{r}" for r in range(nproc)], timeout=READY_S)
    return job


def _line(code: str) -> int:
    """The line of watch_jobs.py that holds ``code``."""
    lines = (PROGRAMS / "watch_jobs.py").read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if code in text)


def _go(tmp_path: Path) -> None:
    (tmp_path / "go").touch()


def test_a_watch_captures_a_rank_stuck_in_a_data_read_before_the_timeout_ends_the_job(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path, watchers: list[int]
) -> None:
    job = _job(jobs, tmp_path, 3, "--mode", "data", "--odd", "2", "--dist-timeout", "20")
    out = tmp_path / "watch"
    started = _start(job, out, watchers)
    assert started["dir"] == str(out) and "watching job" in started["summary"]
    _go(tmp_path)
    manifest = _ended(out, job)
    assert manifest.state == "job_ended" and manifest.job_ended_at is not None
    assert manifest.settings.job_timeout_s == 20 and manifest.settings.job_timeout_source == "args"
    assert len(manifest.incidents) == 1, manifest.incidents
    path = wf.incident_paths(out)[0]
    incident = wf.read_incident(path)
    assert incident.complete and incident.status == "stalled"
    assert incident.job_ended_at is not None and (incident.captured_before_end_s or 0) > 0
    assert [p.name for p in incident.pieces][:1] == ["look"]
    looks = wf.read_looks(path)
    report = judge_look(looks[0], DumpOptions())
    assert report.verdict.suspect_ranks == [2], report.verdict.summary
    assert "read_shard" in json.dumps(looks[0].model_dump(mode="json"))
    # the job's log alone shows only the waiting ranks' timeouts, never where rank 2 was
    assert "read_shard" not in job.output()
    # the morning after: triage of the folder (and the log) names rank 2's FIFO read
    r = triage_logs([str(out), str(job.log_path)])
    fifo = _line('with open(path, "rb")')
    assert r.decided_by == "watch" and r.suspect_ranks == [2], r.summary
    assert "s before the job ended): rank 2" in r.summary and f"watch_jobs.py:{fifo}" in r.summary, r.summary
    assert any(f.kind == "collective_timeout" for f in r.findings)
    alone = triage_logs([str(job.log_path)], read_code=False)
    assert f"watch_jobs.py:{fifo}" not in alone.summary and "read_shard" not in alone.summary
    assert stat.S_IMODE(out.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in path.rglob("*") if f.is_file())


def test_a_lock_cycle_between_two_threads_is_captured_with_both_threads(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path, watchers: list[int]
) -> None:
    job = _job(jobs, tmp_path, 2, "--mode", "locks", "--odd", "1", "--dist-timeout", "20")
    out = tmp_path / "watch"
    started = _mcp(
        "start_watch",
        {"out": str(out), "pid": job.pid, "stall_s": 3, "interval_s": 0.5},
    )
    watchers.append(int(started["watcher_pid"]))
    listed = _mcp("list_watches", {"dirs": [str(out)]})
    assert [w["dir"] for w in listed["watches"]] == [str(out)] and listed["watches"][0]["watcher_alive"]
    _go(tmp_path)
    manifest = _ended(out, job)
    assert len(manifest.incidents) == 1, manifest.incidents
    look = wf.read_looks(wf.incident_paths(out)[0])[0]
    rank1 = next(s for s in look.stacks if s.rank == 1)
    tops = {t.name: t.frames[0] for t in rank1.threads if t.name in ("saver", "logger") and t.frames}
    assert set(tops) == {"saver", "logger"}, [t.name for t in rank1.threads]
    for name, wants in (
        ("saver", "with b:"),
        ("logger", "with a:"),
    ):  # each holds one lock, waits on the other
        top = tops[name]
        assert top.function.endswith(name), top
        assert Path(top.file).read_text().splitlines()[top.line - 1].strip() == wants, top
    view = _mcp("read_watch", {"dir": str(out)})
    assert view["watch"]["state"] == "job_ended" and view["incidents"][0]["manifest"]["complete"]
    # the verdict, live and the morning after, names the cycle and both threads' lines
    lines = [f"{Path(tops[n].file).name}:{tops[n].line}" for n in ("saver", "logger")]
    v = judge_look(look, DumpOptions()).verdict
    assert v.suspect_ranks == [1] and v.confidence == "high", v
    assert "lock-order deadlock (lock cycle `a` -> `b` -> `a`)" in v.summary, v.summary
    cycle = [e for e in v.evidence[:3] if e.startswith("rank 1 thread ")]  # after the window's line
    assert len(cycle) == 2 and all(any(line in e for e in cycle) for line in lines), v.evidence
    r = triage_logs([str(out), str(job.log_path)])
    assert r.decided_by == "watch" and r.suspect_ranks == [1], r.summary
    assert "rank 1 is in a lock-order deadlock" in r.summary, r.summary
    text, _ = shape_answer(bound_triage(r))
    assert all(line in text for line in lines) and len(text) < 2500, text
    # nothing the job left says so: its log has neither the cycle nor the threads' lines
    alone = triage_logs([str(job.log_path)], read_code=False)
    assert "lock-order" not in alone.summary and not any(line in alone.summary for line in lines), (
        alone.summary
    )


def test_a_slow_checkpoint_write_that_resumes_is_an_incident_marked_resumed(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path, watchers: list[int]
) -> None:
    job = _job(
        jobs,
        tmp_path,
        2,
        "--mode",
        "ckpt",
        "--odd",
        "0",
        "--pause",
        "12",
        "--after",
        "15",
        "--dist-timeout",
        "300",
    )
    out = tmp_path / "watch"
    _start(job, out, watchers)
    _go(tmp_path)
    manifest = _ended(out, job)
    assert job.proc.returncode == 0, job.output()[-2000:]
    assert len(manifest.incidents) == 1, manifest.incidents
    incident = wf.read_incident(wf.incident_paths(out)[0])
    assert incident.status == "resumed" and incident.complete, incident
    assert incident.resumed_after_s is not None and 0 < incident.resumed_after_s < 60
    looks = wf.read_looks(wf.incident_paths(out)[0])
    assert "slow_checkpoint" in json.dumps(looks[0].model_dump(mode="json"))


def test_a_hang_in_each_attempt_of_a_restarted_job_is_an_incident_each(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path, watchers: list[int]
) -> None:
    job = _job(
        jobs,
        tmp_path,
        2,
        "--mode",
        "data",
        "--odd",
        "1",
        "--dist-timeout",
        "15",
        launcher=("--max-restarts=1",),
    )
    out = tmp_path / "watch"
    _start(job, out, watchers)
    _go(tmp_path)
    manifest = _ended(out, job)
    assert [a.n for a in manifest.attempts] == [1, 2], manifest.attempts
    first, second = (set(p for ps in a.pids.values() for p in ps) for a in manifest.attempts)
    assert not first & second  # new pids, the same job
    incidents = [wf.read_incident(p) for p in wf.incident_paths(out)]
    assert [i.attempt for i in incidents] == [1, 2], [i.name for i in incidents]
    assert all(i.complete and i.job_ended_at for i in incidents)
    # triage leads with the last attempt's capture and gives the first its own line
    r = triage_logs([str(out)])
    assert r.decided_by == "watch" and r.suspect_ranks == [1], (r.summary, r.watch)
    assert ", attempt 2 of 2, captured " in r.summary and "rank 1 is in no collective" in r.summary
    first = [line for line in r.watch or [] if line.startswith("attempt 1: incident 001-")]
    assert first and "rank 1 is in no collective" in first[0], r.watch


def test_a_watcher_killed_mid_incident_leaves_a_folder_that_reads_incomplete(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path, watchers: list[int]
) -> None:
    job = _job(jobs, tmp_path, 2, "--mode", "data", "--odd", "1", "--dist-timeout", "60")
    out = tmp_path / "watch"
    started = _start(job, out, watchers, "--window", "8")  # a long capture, to kill the watcher in it
    _go(tmp_path)
    wait_for(lambda: bool(wf.incident_paths(out)), 60, "an incident to begin", 0.02)
    os.kill(int(started["watcher_pid"]), signal.SIGKILL)
    incident = wf.read_incident(wf.incident_paths(out)[0])
    assert not incident.complete
    done = run_cli("watch", "--out", str(tmp_path / "unused"), "--pid", "4194999")  # no such process
    assert done.returncode == 2 and "Fix:" in done.stderr
    view = _mcp("read_watch", {"dir": str(out)})
    # compact structured content leaves out fields at their default (false)
    assert not view.get("watcher_alive") and not view["incidents"][0]["manifest"].get("complete")
    assert view["watch"]["state"] == "watching"  # its watcher is gone: nothing marked it ended
    listed = run_cli("watch", "--out", str(out), "--pid", str(job.pid), "--interval", "0")
    assert listed.returncode == 2 and "interval" in listed.stderr


def _mcp(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Client(build_server()) as client:
            result = await client.call_tool(name, arguments)
            assert not result.is_error, result.content
            data: dict[str, Any] = result.structured_content or {}
            return data

    out: dict[str, Any] = anyio.run(go)
    return out
