"""`rankscope run` against real torchrun/gloo jobs: clean, crash, hang, timeout, Ctrl-C; nothing left behind."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rankscope.analysis.runs import bound_run_report, parse_failures
from rankscope.capabilities.launch import run_job
from rankscope.errors import InvalidInput, TorchMissing
from rankscope.models.run import CollapsedLine, RankOutput, RunReport
from rankscope.runtime import procfs
from rankscope.runtime.proctree import descendants, reap_tree
from tests.jobs import PROGRAMS, wait_for
from tests.paths import DATA as DATA_ROOT

SCRIPT = str(PROGRAMS / "run_ranks.py")
DATA = DATA_ROOT / "run"
MARKER = "RANKSCOPE_RUN_TEST_MARKER"


def _marked(tag: str) -> list[int]:
    """Live processes whose environment carries ``MARKER=tag`` (the job's whole tree inherits it)."""
    needle = f"{MARKER}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _launcher_and_ranks(tag: str) -> tuple[list[int], list[int]]:
    """The live torchrun launchers of the job marked ``tag``, and the ranks they started (their
    children that run the script)."""
    marked = _marked(tag)
    launchers = [pid for pid in marked if "torch.distributed.run" in procfs.read_cmdline(pid)]
    ranks = [
        pid
        for pid in marked
        if procfs.parent_of(pid) in launchers
        and any(Path(arg).name == Path(SCRIPT).name for arg in procfs.read_cmdline(pid))
    ]
    return launchers, ranks


def _assert_nothing_left(tag: str, launcher_pid: int | None) -> None:
    assert _marked(tag) == [], f"processes of the job outlived rankscope: {_marked(tag)}"
    if launcher_pid is not None:
        assert descendants(launcher_pid) == []


def _env(tag: str, **extra: str) -> dict[str, str]:
    return {MARKER: tag, **extra}


# --------------------------------------------------------------------------- fast: torchrun's summary


def test_parse_failures_from_captured_torchrun_output() -> None:
    crash = json.loads((DATA / "crash_3ranks.json").read_text())["launcher_output"]
    exits = parse_failures(crash)
    assert [(e.rank, e.exit_code, e.signal, e.root_cause) for e in exits] == [
        (1, 3, None, True),
        (0, -15, "SIGTERM", False),
        (2, -15, "SIGTERM", False),
    ]
    kill = json.loads((DATA / "kill_3ranks.json").read_text())["launcher_output"]
    root = parse_failures(kill)[0]
    assert (root.rank, root.local_rank, root.exit_code, root.signal, root.root_cause) == (
        2,
        2,
        -9,
        "SIGKILL",
        True,
    )
    assert root.detail == "Signal 9 (SIGKILL) received by PID " + str(root.pid)
    assert parse_failures(["no summary here"]) == []


def test_bad_input_is_rejected_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a file"):
        run_job(str(tmp_path / "missing.py"))
    with pytest.raises(InvalidInput, match="nproc"):
        run_job(SCRIPT, nproc=0)
    with pytest.raises(InvalidInput, match="hang_timeout"):
        run_job(SCRIPT, hang_timeout=0)


def test_bounded_report_keeps_head_and_tail_and_says_what_was_cut() -> None:
    lines = [CollapsedLine(ranks=[0, 1], text=f"step {i} " + "x" * 60, uniform=True) for i in range(2000)]
    raw = [RankOutput(rank=r, stdout=[line.text for line in lines]) for r in (0, 1)]
    report = RunReport(outcome="ok", summary="ok", nproc=2, duration_s=1.0, collapsed_stdout=lines, ranks=raw)
    bounded = bound_run_report(report)
    assert bounded.truncated and bounded.ranks == []
    texts = [c.text for c in bounded.collapsed_stdout]
    assert texts[0].startswith("step 0 ") and texts[-1].startswith("step 1999 ")
    marker = next(t for t in texts if "line(s) cut" in t)
    assert int(marker.split()[1]) == 2000 - (len(texts) - 1)
    assert (
        bounded.hint is not None
        and "collapsed stdout" in bounded.hint
        and "raw per-rank output" in bounded.hint
    )
    assert len(bounded.model_dump_json()) < 20_000


def test_interpreter_without_torch_gets_torch_missing(tmp_path: Path) -> None:
    """An interpreter that cannot import torch (here: ours without site-packages) is named, with the fix."""
    no_site = tmp_path / "python-without-torch"
    no_site.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    no_site.chmod(0o755)
    with pytest.raises(TorchMissing, match="cannot import torch") as info:
        run_job(SCRIPT, ["clean"], python=str(no_site), timeout=60)
    assert "Python environment of the training job" in info.value.render()


# --------------------------------------------------------------------------- real runs


@pytest.mark.slow
def test_clean_run_streams_prefixed_output_and_collapses_it() -> None:
    tag = uuid.uuid4().hex
    stream = io.StringIO()
    report = run_job(SCRIPT, ["clean"], nproc=2, hang_timeout=60, timeout=150, env=_env(tag), stream=stream)
    assert report.outcome == "ok", report.model_dump_json(indent=1)
    assert report.exit_code == 0 and report.failed_ranks == []
    streamed = stream.getvalue().splitlines()
    assert "[rank0]: world size 2" in streamed and "[rank1]: world size 2" in streamed
    assert "[rank1]: warning: rank 1 saw an odd batch" in streamed
    got = [(c.ranks, c.text, c.uniform) for c in report.collapsed_stdout]
    assert got == [
        ([0, 1], "world size 2", True),
        ([0, 1], "sum 2.0", True),
        ([0], "local 1.0", False),
        ([1], "local 2.0", False),
        ([0, 1], "done", True),
    ]
    assert (
        CollapsedLine(ranks=[1], text="warning: rank 1 saw an odd batch", uniform=False)
        in report.collapsed_stderr
    )
    assert [o.rank for o in report.ranks] == [0, 1] and report.ranks[1].stdout[-1] == "done"
    _assert_nothing_left(tag, report.launcher_pid)


@pytest.mark.slow
def test_crash_on_one_rank_exits_nonzero_and_names_it(tmp_path: Path) -> None:
    """Through the real CLI: exit status non-zero, JSON names rank 1 and its exit code."""
    tag = uuid.uuid4().hex
    out = subprocess.run(
        [sys.executable, "-m", "rankscope", "run", "--nproc", "2", "--hang-timeout", "60", "--timeout", "150",
         "--json", "--", SCRIPT, "crash", "1"],
        capture_output=True, text=True, timeout=200, env={**os.environ, MARKER: tag}, cwd=str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["outcome"] == "crashed"
    root = report["failed_ranks"][0]
    assert (root["rank"], root["exit_code"], root["root_cause"]) == (1, 3, True)
    assert "rank 1 (exit code 3)" in report["summary"]
    assert "[rank1]: rank 1 after first all_reduce" in out.stderr  # streamed to stderr with --json
    _assert_nothing_left(tag, report["launcher_pid"])


@pytest.mark.slow
def test_hang_captures_stacks_and_verdict_then_reaps(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    ready = tmp_path / "ready"
    ready.mkdir()
    report = run_job(
        SCRIPT, ["hang"], nproc=3, hang_timeout=4, timeout=150, env=_env(tag, RANKSCOPE_TEST_READY=str(ready))
    )
    assert report.outcome == "hung", report.model_dump_json(indent=1)
    assert sorted(p.name for p in ready.iterdir()) == ["rank0", "rank1", "rank2"]  # hung after start-up
    assert report.hang_evidence and "no output" in report.hang_evidence
    assert report.stacks is not None, report.notes
    verdict = report.stacks.verdict
    assert verdict.kind == "mismatched_collectives"
    assert verdict.suspect_ranks == [1]  # rank 1 waits in barrier, ranks 0 and 2 in all_reduce
    assert report.next_steps, "a hang must say what to do next"
    assert [c.text for c in report.collapsed_stdout] == ["first all_reduce ok"]
    _assert_nothing_left(tag, report.launcher_pid)


@pytest.mark.slow
def test_timeout_terminates_the_whole_tree() -> None:
    """A launcher and one rank are tree enough: torchrun starts the rank in a session of its own, so
    only a reap that follows the tree reaches it (the several-rank runs above leave nothing behind
    either)."""
    tag = uuid.uuid4().hex
    report = run_job(SCRIPT, ["quiet"], nproc=1, hang_timeout=None, timeout=12, env=_env(tag))
    assert report.outcome == "timeout"
    assert report.exit_code is None and "12s limit" in report.summary
    _assert_nothing_left(tag, report.launcher_pid)


HEARS_CTRL_C = "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); runpy.run_module('rankscope', run_name='__main__')"
"""``python -m rankscope`` with SIGINT as a terminal's rankscope has it: a suite started in the
background (``cmd &`` in a script) inherits SIGINT ignored, and so would rankscope."""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_reaps_everything_and_exits_130(tmp_path: Path, sig: signal.Signals) -> None:
    """torchrun and its one rank, which runs in a session of its own, are both gone once rankscope is
    told to stop."""
    tag = uuid.uuid4().hex
    ready = tmp_path / "ready"
    ready.mkdir()
    log = tmp_path / "rankscope.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", HEARS_CTRL_C, "run", "--nproc", "1", "--hang-timeout", "0", "--", SCRIPT, "quiet"],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, MARKER: tag, "RANKSCOPE_TEST_READY": str(ready)},
        )  # fmt: skip
    try:
        wait_for(lambda: len(list(ready.iterdir())) == 1 or proc.poll() is not None, 90, "the rank ready")
        assert proc.poll() is None, log.read_text()
        launchers, ranks = _launcher_and_ranks(tag)  # the tree to reap: torchrun and its rank
        assert len(launchers) == 1 and len(ranks) == 1, _marked(tag)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 130, log.read_text()
        assert "interrupted" in log.read_text()
        _assert_nothing_left(tag, None)
    finally:
        if proc.poll() is None:
            reap_tree(proc, grace=3.0)
        for pid in _marked(tag):  # never leave a stray job behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
