"""A dead job whose one rank left no traceback, triaged after the fact from its logs and script,
and the morning after in one call: `rankscope triage <watch folder>` on a real job's capture.

A 4-rank gloo job (``silent_rank.py queue``) trains until one rank stops in a queue read, outside
any collective, and the job's own init_process_group(timeout=20 s) ends every rank. While it
hangs, the host's look is taken as a watch takes it (`stacks --local`'s capture), and written into
a watch folder by the folder's own writer; after the job is gone, triage of the folder names the
rank, its line and why, where the job's logs alone show only the timeouts of the ranks that
waited. The same look then fills the folders a watch leaves in harder nights: a restart (one line
per attempt), a watcher killed mid-incident (incomplete), a slow phase that resumed, a host that
went away. A real watcher's folder, triaged the same way, is test_watch_live.py's.

The same dead job's logs alone, with the script read beside them, name the silent rank, the
collective the others timed out in, and the blocking call the code has the silent rank pass before
it; a second job (``short``, 2 ranks: the silent one and one that waits) is triaged from a copy of
its logs that names paths this host lacks. Both jobs serve every test of the module: each start
of a torch job costs seconds of CPU on a small machine, and the tests only read them.
"""

from __future__ import annotations

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
from tests.jobs import PROGRAMS, JobFactory, RunningJob, wait_for

pytestmark = pytest.mark.slow

SCRIPT = PROGRAMS / "silent_rank.py"
READY_S = 180.0
QUEUE_TIMEOUT_S = "20"
"""Long enough for the live look (a few looks of a 1 s window on a loaded host) before the job dies."""
SHORT_TIMEOUT_S = "12"
SETTINGS = WatchSettings(
    interval_s=1.0,
    stall_s=5.0,
    job_timeout_s=20.0,
    job_timeout_source="default",
    max_incidents=5,
    max_incident_bytes=10**7,
)


def _line(text: str) -> int:
    """The line of silent_rank.py that holds ``text`` (the tests never hard-code line numbers)."""
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def _collective(function: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    start = next(n for n, line in enumerate(lines, 1) if line.startswith(f"def {function}("))
    return next(n for n, line in enumerate(lines, 1) if n > start and "dist.all_reduce(total)" in line)


@dataclass
class Night:
    """The queue job's capture at the stall, when it was taken and when the job ended, the job
    itself (its log), and the dead ``short`` job."""

    look: HostLook
    stalled_at: str
    captured_at: str
    ended_at: str
    job: RunningJob
    short: RunningJob


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
    """The queue job, looked at while it hangs, and the short job, started once that look is taken
    (its start then overlaps the queue job's wait for its timeout, not the look); both dead."""
    factory = JobFactory(tmp_path_factory.mktemp("watch-triage"))
    try:
        env = {"JOB_TIMEOUT_S": QUEUE_TIMEOUT_S, "SILENT_RANK": "1"}
        job = factory.torchrun("silent_rank.py", nproc=4, args=["queue"], env=env)
        job.wait_ready(timeout=READY_S)
        look, stalled_at = _stalled_look(job)
        captured_at = utc_now()
        short = factory.torchrun(
            "silent_rank.py", nproc=2, args=["short"], env={**env, "JOB_TIMEOUT_S": SHORT_TIMEOUT_S}
        )
        job.wait_exit(120, "the job to die by its own timeout")
        ended_at = utc_now()
        short.wait_exit(240, "the short job to die by its own timeout")
        yield Night(look, stalled_at, captured_at, ended_at, job, short)
    finally:
        factory.cleanup()


def _log_dir(job: RunningJob, tmp: Path, text_from: str = "", text_to: str = "") -> Path:
    """The job's log alone in a folder, as the scheduler leaves it (paths in it rewritten when asked)."""
    assert job.proc.returncode not in (None, 0), job.output()
    folder = tmp / job.log_path.stem
    folder.mkdir()
    log = job.output().replace(text_from, text_to) if text_from else job.output()
    (folder / "torchrun.log").write_text(log)
    return folder


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


def test_queue_never_filled_names_the_rank_and_its_get(night: Night, tmp_path: Path) -> None:
    folder = _log_dir(night.job, tmp_path)
    r = triage_logs([str(folder)])
    assert r.suspect_ranks == [1] and r.victim_ranks == [0, 2, 3]
    where = f"{SCRIPT}:{_collective('train_queue')} in train_queue"
    assert r.summary.startswith(
        f"Rank 1 left no traceback while ranks 0,2-3 timed out in the collective at {where}"
    )
    get = _line("batch = batches.get()")
    assert r.blocking_calls and r.blocking_calls[0].startswith(f":{get} `batch = batches.get()`")
    said = r.blocking_calls[0]
    assert "no timeout" in said and "filled by thread read_source" in said
    assert f"after its own wait at :{_line('source.wait()')} `source.wait()`" in said
    # the logs alone name the silent rank, but neither the line nor what it waits on
    alone = triage_logs([str(folder)], read_code=False)
    assert alone.suspect_ranks == [1] and not alone.blocking_calls and str(get) not in alone.summary
    text, _ = shape_answer(bound_triage(r))
    assert text.startswith("verdict: Rank 1 left no traceback") and f":{get} `batch = batches.get()`" in text


def test_short_shard_names_the_get_behind_the_helper(night: Night, tmp_path: Path) -> None:
    """The job ran elsewhere (its traceback names a path this host lacks): the script given beside
    the logs is read in its place, and without it the answer says to pass it."""
    elsewhere = "/srv/jobs/train-42/silent_rank.py"
    folder = _log_dir(night.short, tmp_path, str(SCRIPT), elsewhere)
    missing = triage_logs([str(folder)])
    assert missing.suspect_ranks == [1] and not missing.blocking_calls
    assert "its code is not on this host: pass the script too" in missing.summary
    r = triage_logs([str(folder), str(SCRIPT)])
    assert r.suspect_ranks == [1]
    assert f"at {elsewhere}:{_collective('train_short')} in train_short" in r.summary
    get, via = _line("return q.get()"), _line("total += next_batch(ready)")
    (said,) = r.blocking_calls
    assert said.startswith(f":{get} `return q.get()` (via :{via} `total += next_batch(ready)`)")
    assert "filled by thread prefetch" in said and "no more once `shard` ends" in said
    assert any(s.kind == "source" and s.path == str(SCRIPT) for s in r.sources)
