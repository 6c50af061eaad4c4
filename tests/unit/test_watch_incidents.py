"""Which incident of a watch folder decides, and the lines said beside its verdict (pure, on manifests)."""

from __future__ import annotations

from pathlib import Path

from rankscope.analysis.triage.watch_incidents import (
    attempt_lines,
    deciding,
    hosts_gone,
    incomplete,
    slow_phases,
    watch_lines,
    when_captured,
)
from rankscope.capabilities.triage import triage_logs
from rankscope.capabilities.watch_folder import new_incident, write_look, write_watch
from rankscope.models.look import HostLook
from rankscope.models.watch import (
    IncidentManifest,
    IncidentPiece,
    WatchAttempt,
    WatchHost,
    WatchManifest,
    WatchSettings,
)
from tests.paths import DATA

T0 = "2026-11-28T03:00:12+00:00"
SETTINGS = WatchSettings(interval_s=1.0, stall_s=60.0, max_incidents=5, max_incident_bytes=1 << 20)


def _m(name: str, attempt: int = 1, **kw: object) -> IncidentManifest:
    return IncidentManifest(name=name, attempt=attempt, stall_suspected_at=T0, **kw)  # type: ignore[arg-type]


def _w(**kw: object) -> WatchManifest:
    return WatchManifest(watcher_pid=1, watcher_host="h", started_at=T0, settings=SETTINGS, **kw)  # type: ignore[arg-type]


def test_the_latest_stalled_incident_of_each_attempt_decides() -> None:
    ms = [
        _m("001"),
        _m("002", status="resumed", resumed_after_s=90.0),
        _m("003"),
        _m("004", attempt=2),
        _m("005", attempt=2, status="resumed"),
    ]
    assert [m.name for m in deciding(ms)] == ["003", "004"]
    assert deciding([_m("001", status="resumed")]) == []


def test_when_it_was_captured_relative_to_the_jobs_end() -> None:
    m = _m("001", captured_at="2026-11-28T03:00:29+00:00")
    assert (
        when_captured(m, _w(job_ended_at="2026-11-28T03:01:10+00:00")) == "captured 41 s before the job ended"
    )
    attempt = [WatchAttempt(n=1, first_seen=T0, ended_at="2026-11-28T03:00:39+00:00")]
    assert when_captured(m, _w(attempts=attempt)) == "captured 10 s before the job ended"
    assert (
        when_captured(m.model_copy(update={"captured_before_end_s": 7.0}), _w())
        == "captured 7 s before the job ended"
    )
    assert "still running" in when_captured(m, _w(state="watching"))
    assert "not recorded" in when_captured(m, _w(state="stopped"))


def test_incomplete_slow_phases_and_hosts_gone_are_each_one_line() -> None:
    pieces = [IncidentPiece(name="look", captured_at=T0), IncidentPiece(name="gpu", captured_at=T0, ok=False)]
    cut = _m("002", pieces=pieces, hosts_missing=[WatchHost(host="n2", state="gone", note="step ended")])
    said = incomplete(cut)
    assert said is not None and said.startswith(
        "incomplete: the watcher stopped before it finished incident 002"
    )
    assert "(gpu failed)" in said and "read what is there: look" in said
    assert incomplete(cut.model_copy(update={"complete": True})) is None
    slow = [_m(f"00{i}", status="resumed", resumed_after_s=float(i * 10)) for i in range(1, 6)]
    assert (
        slow_phases(slow)
        == "slow phases (the job moved again: not hangs): 001 after 10 s, 002 after 20 s, 003 after 30 s and 2 more"
    )
    gone = hosts_gone(_w(hosts=[WatchHost(host="n1"), WatchHost(host="n3", state="unreachable")]), [cut])
    assert gone == ["host n3: unreachable", "host n2: missing from 002 (step ended)"]
    assert watch_lines(_w(), [], None) == ["the watch recorded no incident (state: starting)"]
    assert watch_lines(_w(), slow[:1], None)[0] == "no incident stayed stalled: every one resumed"


# -- the real H200 night (tests/data/h200/watch_stall_nccl): NCCL, a FIFO read, the watchdog at 30 s ---------

H200 = DATA / "h200" / "watch_stall_nccl"


def test_an_nccl_watch_folder_leads_with_the_capture_and_the_logs_follow(tmp_path: Path) -> None:
    """The look a watch keeps (taken 27 s before the watchdog fired), in a folder written by the
    folder's own writer: triage names rank 2, its FIFO open and the guard, as the live call did."""
    look = HostLook.model_validate_json((H200 / "a1" / "look.json").read_text())
    folder = tmp_path / "watch"
    m = IncidentManifest(
        name="001-20261128T181435Z",
        stall_suspected_at="2026-11-28T18:14:35+00:00",
        captured_at="2026-11-28T18:14:38+00:00",
        job_ended_at="2026-11-28T18:16:06+00:00",
        complete=True,
    )
    write_look(new_incident(folder, m), look)
    write_watch(folder, _w(state="job_ended", incidents=[m.name]))
    r = triage_logs([str(folder), str(H200 / "torchrun.log")])
    assert r.decided_by == "watch" and r.suspect_ranks == [2] and r.victim_ranks == [0, 1, 3]
    assert r.summary.startswith(
        f"From the watch's capture (incident {m.name}, captured 88 s before the job ended): "
    )
    assert "rank 2 is in no collective, at w_stall.py:16" in r.summary
    assert any("w_stall.py:13" in e and "guards" in e for e in r.evidence)
    assert any(f.kind == "collective_timeout" for f in r.findings)  # the logs' own, after the verdict
    assert all(s.tool != "dump_stacks" for s in r.next_steps)  # nothing live to ask of a dead job


def test_nccl_logs_with_the_collectives_stack_and_the_script_name_the_fifo_open() -> None:
    """torch >= 2.10 prints the failed collective's Python stack under the watchdog's line: the silent
    rank's code is read from the script given beside the log (the job ran in /workspace)."""
    script = DATA / "h200" / "scripts" / "w_stall.py"
    r = triage_logs([str(H200 / "torchrun.log"), str(script)])
    assert r.suspect_ranks == [2]
    assert r.summary.startswith(
        "Rank 2 left no traceback while ranks 0-1,3 timed out in the collective at /workspace/w_stall.py:35 in main"
    )
    assert "no rank fell behind" not in r.summary
    assert r.blocking_calls and r.blocking_calls[0].startswith(':16 `with open(shard, "rb") as f:` (via :30 ')
    alone = triage_logs([str(H200 / "torchrun.log")])
    assert "its code is not on this host: pass the script too" in alone.summary and not alone.blocking_calls


def test_earlier_attempts_are_timed_against_their_own_end_and_bounded() -> None:
    ms = [
        _m(f"00{n}", attempt=n, captured_at=T0, job_ended_at="2026-11-28T03:00:30+00:00") for n in range(1, 6)
    ]
    lines = attempt_lines([(m, "rank 1 is in no collective") for m in ms], _w())
    assert lines[0] == "2 earlier attempts stalled too (read_watch lists them)" and len(lines) == 4
    assert (
        lines[1]
        == "attempt 3: incident 003, captured 18 s before that attempt ended: rank 1 is in no collective"
    )
