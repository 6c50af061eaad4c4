"""A crash at exit is named for what it is: a script that never called destroy_process_group().

A rank that finishes training and then aborts with "terminate called without an active exception"
(SIGABRT, exit -6) must not read as a signal death to chase in the kernel log: the finding names the
missing destroy_process_group() and its fix leads the next steps, in every shape the line comes in
(torchrun's plain output, a ``[rankN]:`` prefixed --tee log, torch's own warning), while after
another failure (a watchdog timeout, two ranks on one GPU) the exit lines only follow it.
"""

from __future__ import annotations

from pathlib import Path

from rankscope.capabilities.triage import triage_logs
from rankscope.models.logs import TriageReport
from tests.paths import DATA

CAPTURE = DATA / "crash_at_exit" / "torchrun.log"

TABLE = """\
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_02:09:46
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : -6 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 4242
=======================================================
"""


def _kinds(report: TriageReport) -> dict[str, list[int]]:
    return {f.kind: f.ranks for f in report.findings}


def _triage(tmp_path: Path, text: str) -> TriageReport:
    log = tmp_path / "train.log"
    log.write_text(text)
    return triage_logs([str(log)])


def test_the_real_capture_names_the_missing_destroy_and_its_fix() -> None:
    report = triage_logs([str(CAPTURE)])
    assert report.suspect_ranks == [1]
    assert _kinds(report)["exit_without_destroy"] == [1]
    lead = report.findings[0]
    assert (
        lead.kind == "exit_without_destroy" and "terminate called without an active exception" in lead.excerpt
    )
    assert "destroy_process_group()" in lead.fix
    abort = next(
        f for f in report.findings if f.kind == "killed_by_signal" and f.facts["signal"] == "SIGABRT"
    )
    assert abort.severity == "info" and "destroy_process_group()" in abort.fix
    steps = report.next_steps
    assert steps[0].skill_section == "skill/crashes.md#exit-without-destroy"
    assert not any("kernel log" in s.action for s in steps)
    assert "destroy_process_group()" in report.summary


def test_a_rank_prefixed_line_names_its_rank(tmp_path: Path) -> None:
    report = _triage(
        tmp_path, "[rank3]:terminate called without an active exception\n" + TABLE.format(rank=3)
    )
    assert report.suspect_ranks == [3] and _kinds(report)["exit_without_destroy"] == [3]


def test_torch_warning_alone_is_named_without_a_crash(tmp_path: Path) -> None:
    text = (
        "[rank0]:[W1127 02:09:46.1 ProcessGroupNCCL.cpp:1250] Warning: WARNING: destroy_process_group() was "
        "not called before program exit, which can leak resources.\n"
    )
    report = _triage(tmp_path, text)
    assert _kinds(report) == {"exit_without_destroy": [0]}
    assert report.findings[0].severity == "warning" and report.suspect_ranks == []
    assert "destroy_process_group()" in report.summary


def test_after_another_failure_the_exit_lines_only_follow_it() -> None:
    """A real NCCL log: two ranks on one GPU fail, then torch warns at exit that nothing destroyed
    the process group. The shared GPU stays the answer."""
    report = triage_logs([str(DATA / "logs" / "h200" / "duplicate_gpu.log")])
    exits = [f for f in report.findings if f.kind == "exit_without_destroy"]
    assert exits and all(f.severity == "info" for f in exits)
    assert "destroy_process_group" not in report.summary and report.findings[0].kind == "duplicate_gpu"


def test_a_watchdog_abort_stays_the_watchdogs(tmp_path: Path) -> None:
    """After a collective timeout, SIGABRT is the watchdog's: the exit line does not explain it away."""
    text = (
        "[rank1]:[E1127 02:09:40.1 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for "
        "600005 milliseconds before timing out.\n"
        "terminate called without an active exception\n" + TABLE.format(rank=1)
    )
    report = _triage(tmp_path, text)
    abort = next(f for f in report.findings if f.kind == "killed_by_signal")
    assert "watchdog" in abort.explanation
