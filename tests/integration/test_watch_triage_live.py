"""The morning after in one call: `rankscope triage <watch folder>` on a real job's capture.

A 4-rank gloo job trains until one rank stops in a queue read, outside any collective, and the
job's own init_process_group(timeout=30 s) ends every rank. While it hangs, the host's look is
taken as a watch takes it (`stacks --local`'s capture), and written into a watch folder by the
folder's own writer; after the job is gone, triage of the folder names the rank, its line and
why, where the job's logs alone show only the timeouts of the ranks that waited. The same look
then fills the folders a watch leaves in harder nights: a restart (one line per attempt), a
watcher killed mid-incident (incomplete), a slow phase that resumed, a host that went away.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankscope.analysis.hang.progress_verdict import PROGRESS_KINDS
from rankscope.analysis.sizing.bound import bound_triage
from rankscope.capabilities.remote import judge_looks
from rankscope.capabilities.stacks import look_here
from rankscope.capabilities.triage import triage_logs
from rankscope.capabilities.watch_folder import (
    incident_name,
    new_incident,
    read_watch,
    utc_now,
    write_incident,
    write_look,
    write_watch,
)
from rankscope.models.look import HostLook
from rankscope.models.watch import (
    IncidentManifest,
    IncidentPiece,
    WatchAttempt,
    WatchHost,
    WatchManifest,
    WatchSettings,
)
from rankscope.options import DumpOptions
from rankscope.render.answer import shape_answer
from rankscope.runtime import procfs
from tests.jobs import PROGRAMS, JobFactory, RunningJob, free_port, run_cli, torchrun_argv, wait_for

pytestmark = pytest.mark.slow

SCRIPT = PROGRAMS / "silent_rank.py"
READY_S = 180.0
SETTINGS = WatchSettings(
    interval_s=1.0,
    stall_s=5.0,
    job_timeout_s=30.0,
    job_timeout_source="default",
    max_incidents=5,
    max_incident_bytes=10**7,
)


def _line(text: str) -> int:
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


@dataclass
class Night:
    """The job's capture at the stall, when it was taken and when the job ended, and its log."""

    look: HostLook
    stalled_at: str
    captured_at: str
    ended_at: str
    job: RunningJob


def _stalled_look(job: RunningJob) -> tuple[HostLook, str]:
    """Looks taken as a watch takes them, until one is judged a hang (not a job that moves)."""
    found: list[HostLook] = []
    first = utc_now()

    def stalled() -> bool:
        look = look_here(job.pid, DumpOptions(window=1.0))
        verdict = judge_looks({look.host: look}, [look.host], [], DumpOptions(flight_recorder=False)).verdict
        found[:] = [look]
        return verdict.kind not in PROGRESS_KINDS

    wait_for(stalled, 60, "a look that judges the job hung", interval=0.5)
    return found[0], first


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Night]:
    factory = JobFactory(tmp_path_factory.mktemp("watch-triage"))
    try:
        job = factory.torchrun("silent_rank.py", nproc=4, args=["queue"], env={"JOB_TIMEOUT_S": "30"})
        job.wait_ready(timeout=READY_S)
        look, stalled_at = _stalled_look(job)
        captured_at = utc_now()
        wait_for(lambda: job.proc.poll() is not None, 120, "the job to die by its own timeout")
        yield Night(look, stalled_at, captured_at, utc_now(), job)
    finally:
        factory.cleanup()


def _watched_to_its_end(job: RunningJob, tmp_path: Path, go: Path, job_s: float) -> Path:
    """A detached watch started beside ``job`` before its stall (``go`` lets the job stall); the
    watch folder once the job ended and the watch saw it end. The watcher never outlives the test."""
    out = tmp_path / "watch"
    done = run_cli("watch", "--pid", str(job.pid), "--out", str(out), "--detach", "--json", *WATCH_FAST)
    assert done.returncode == 0, done.stderr
    watcher = int(json.loads(done.stdout)["watcher_pid"])
    try:
        go.touch()
        job.proc.wait(timeout=job_s)
        wait_for(lambda: read_watch(out).state != "watching", 60, "the watch to see the job end", 0.2)
    finally:
        if procfs.is_alive(watcher):
            os.kill(watcher, signal.SIGTERM)
    return out


def _watch(night: Night, **update: object) -> WatchManifest:
    watch = WatchManifest(
        watcher_pid=1,
        watcher_host=night.look.host,
        started_at=night.stalled_at,
        state="job_ended",
        job_ended_at=night.ended_at,
        attempts=[WatchAttempt(n=1, first_seen=night.stalled_at, ended_at=night.ended_at)],
        hosts=[WatchHost(host=night.look.host, state="ended")],
        settings=SETTINGS,
    )
    return watch.model_copy(update=update)


def _incident(folder: Path, night: Night, n: int, **update: object) -> IncidentManifest:
    """An incident written as the watcher writes one: manifest first, the look, the manifest last."""
    m = IncidentManifest(
        name=incident_name(n, night.stalled_at), stall_suspected_at=night.stalled_at, **update
    )  # type: ignore[arg-type]
    path = new_incident(folder, m)
    if m.status == "stalled":
        write_look(path, night.look)
    piece = IncidentPiece(name="look", file=f"look-{night.look.host}.json", captured_at=night.captured_at)
    done = m.model_copy(update={"captured_at": night.captured_at, "pieces": [piece], **update})
    write_incident(path, done)
    return done


def test_the_watch_folder_names_the_rank_and_line_the_logs_cannot(night: Night, tmp_path: Path) -> None:
    folder = tmp_path / "watch"
    m = _incident(folder, night, 1, job_ended_at=night.ended_at, complete=True)
    write_watch(folder, _watch(night, incidents=[m.name]))
    r = triage_logs([str(folder), str(night.job.log_path)])
    get = _line("batch = batches.get()")
    assert r.decided_by == "watch" and r.suspect_ranks == [1] and r.victim_ranks == [0, 2, 3]
    assert r.summary.startswith(f"From the watch's capture (incident {m.name}, captured ")
    assert "s before the job ended): rank 1 is in no collective" in r.summary
    assert f"silent_rank.py:{get} blocked in Queue.get" in r.summary
    assert any(f.kind == "collective_timeout" for f in r.findings)  # the logs' own findings follow
    # the logs alone show only the timeouts of the ranks that waited: no line of rank 1's
    alone = triage_logs([str(night.job.log_path)], read_code=False)
    assert f"silent_rank.py:{get}" not in alone.summary and not alone.blocking_calls
    text, _ = shape_answer(bound_triage(r))
    assert text.startswith("verdict: From the watch's capture") and len(text) < 2000, text


def test_restart_incomplete_slow_phase_and_a_host_gone_are_each_said(night: Night, tmp_path: Path) -> None:
    folder = tmp_path / "watch"
    slow = _incident(folder, night, 1, status="resumed", resumed_after_s=95.0, complete=True)
    first = _incident(folder, night, 2, attempt=1, job_ended_at=night.ended_at, complete=True)
    second = _incident(
        folder,
        night,
        3,
        attempt=2,
        hosts_missing=[WatchHost(host="node2", state="gone", note="its srun step ended")],
    )
    attempts = [
        WatchAttempt(n=1, first_seen=night.stalled_at, ended_at=night.ended_at),
        WatchAttempt(n=2, first_seen=night.ended_at),
    ]
    write_watch(folder, _watch(night, attempts=attempts, incidents=[slow.name, first.name, second.name]))
    r = triage_logs([str(folder)])
    assert r.decided_by == "watch" and r.suspect_ranks == [1]
    assert r.summary.startswith(f"From the watch's capture (incident {second.name}, attempt 2 of 2, ")
    said = "\n".join(r.watch or [])
    assert f"incomplete: the watcher stopped before it finished incident {second.name}" in said
    assert f"slow phases (the job moved again: not hangs): {slow.name} after 95 s" in said
    assert "host node2: missing from" in said and "its srun step ended" in said
    assert f"attempt 1: incident {first.name}, captured " in said and "rank 1 is in no collective" in said


# -- the real watcher --------------------------------------------------------------------------------------

WATCH_FAST = ["--interval", "0.5", "--stall", "3", "--confirm", "0.5", "--resume", "2"]


def test_a_real_watch_then_triage_names_the_rank_its_line_and_why(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path
) -> None:
    """The issue's night: a watch started beside a training job before its stall; the job's own
    30 s timeout ends it; triage of the folder (and the job's log) names rank 2's FIFO read."""
    go = tmp_path / "go"
    job = jobs.torchrun(
        "watch_jobs.py",
        nproc=4,
        args=["--mode", "data", "--odd", "2", "--dist-timeout", "30", "--go", str(go)],
    )
    job.wait_ready([f"up-rank{r}" for r in range(4)], timeout=READY_S)
    out = _watched_to_its_end(job, tmp_path, go, 150)
    r = triage_logs([str(out), str(job.log_path)])
    fifo = next(
        n
        for n, line in enumerate((PROGRAMS / "watch_jobs.py").read_text().splitlines(), 1)
        if 'with open(path, "rb")' in line
    )
    assert r.decided_by == "watch" and r.suspect_ranks == [2], r.summary
    assert "s before the job ended): rank 2" in r.summary and f"watch_jobs.py:{fifo}" in r.summary, r.summary
    assert any(f.kind == "collective_timeout" for f in r.findings)
    alone = triage_logs([str(job.log_path)], read_code=False)
    assert f"watch_jobs.py:{fifo}" not in alone.summary and "read_shard" not in alone.summary


def test_a_restarted_job_gives_one_line_per_attempt(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path
) -> None:
    """torchrun --max-restarts=1: each attempt stalls and times out; the watch keeps an incident per
    attempt; triage leads with the last attempt's capture and gives the first its own line."""
    go = tmp_path / "go"
    port = free_port()
    argv = torchrun_argv(
        "watch_jobs.py",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "--max-restarts=1",
        args=["--mode", "data", "--odd", "1", "--dist-timeout", "15", "--go", str(go)],
    )
    job = jobs.start(argv, 2, port)
    job.wait_ready(["up-rank0", "up-rank1"], timeout=READY_S)
    out = _watched_to_its_end(job, tmp_path, go, 240)
    r = triage_logs([str(out)])
    assert r.decided_by == "watch" and r.suspect_ranks == [1], (r.summary, r.watch)
    assert ", attempt 2 of 2, captured " in r.summary and "rank 1 is in no collective" in r.summary
    first = [line for line in r.watch or [] if line.startswith("attempt 1: incident 001-")]
    assert first and "rank 1 is in no collective" in first[0], r.watch
