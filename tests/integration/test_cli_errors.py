"""Bad input gets a clear message with a fix and exit code 2, never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope import cli
from rankscope.analysis.hang.stacks import analyze
from rankscope.capabilities.discovery import find_job, proc_state
from rankscope.capabilities.stacks import capture_job
from rankscope.options import DumpOptions
from tests.jobs import JobFactory, RunningJob, wait_for

RANKSCOPE = Path(sys.executable).parent / "rankscope"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def assert_clean_error(code: int, err: str, *needles: str, exit_code: int = 2) -> None:
    """A clean error: 2, no answer (bad input, nothing to read, or rankscope could not read it)."""
    assert code == exit_code, err
    assert "Traceback" not in err
    assert "error:" in err and "Fix:" in err
    for needle in needles:
        assert needle in err, err


@pytest.fixture
def fake_job(jobs: JobFactory) -> Iterator[RunningJob]:
    """Two stand-in ranks (RANK/WORLD_SIZE set, no torch) whose launcher reaps exits at once."""
    job = jobs.python("fake_launcher.py", nproc=2, args=["env", "2", "2", "--reap"])
    job.wait_ready(["launched", "rank0", "rank1"], timeout=60)
    yield job


def test_nonexistent_pid() -> None:
    for cmd in ("stacks", "ps"):
        code, _, err = run_cli(cmd, "--pid", str(2**22 + 4242))
        assert_clean_error(code, err, "No process with pid", "rankscope ps")


def test_invalid_pid_and_timeout() -> None:
    code, _, err = run_cli("stacks", "--pid", "-3")
    assert_clean_error(code, err, "positive")
    code, _, err = run_cli("stacks", "--pid", "1", "--timeout", "0")
    assert_clean_error(code, err, "--timeout")


def test_cli_and_mcp_refuse_a_rank_filter_on_several_hosts_alike() -> None:
    """One check for both faces: the CLI no longer drops --only-rank when --hosts is given."""
    code, out, err = run_cli("stacks", "--hosts", "node1,node2", "--only-rank", "3")
    assert_clean_error(code, err, "ranks (--only-rank) selects ranks on this host only")
    assert out == ""


def test_non_python_and_unrelated_python_pids() -> None:
    sleeper = subprocess.Popen(["sleep", "600"])
    plain = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
    try:
        code, _, err = run_cli("stacks", "--pid", str(sleeper.pid))
        assert_clean_error(code, err, "not a Python process")
        code, _, err = run_cli("stacks", "--pid", str(plain.pid))
        assert_clean_error(code, err, "not part of a distributed PyTorch job", "torchrun")
    finally:
        for p in (sleeper, plain):
            p.kill()
            p.wait(timeout=10)


def test_pyspy_missing(fake_job: RunningJob, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.delenv("RANKSCOPE_PYSPY", raising=False)
    code, _, err = run_cli("stacks", "--pid", str(fake_job.pid))
    assert_clean_error(code, err, "py-spy was not found", "pip install py-spy")


def test_unknown_rank_filter(fake_job: RunningJob, pyspy_works: str) -> None:
    code, _, err = run_cli("stacks", "--pid", str(fake_job.pid), "--only-rank", "7")
    assert_clean_error(code, err, "ranks [7]")


def test_report_exits_zero_and_rank_exiting_mid_capture_is_a_rank_error(
    fake_job: RunningJob, pyspy_works: str
) -> None:
    code, out, _ = run_cli("stacks", "--pid", str(fake_job.pid), "--json")
    data = json.loads(out)
    assert code == 0 and data["verdict"]["kind"] == "no_collective" and data["errors"] == []
    # discovery saw both ranks; rank 1 then exits before py-spy reaches it
    job = find_job(fake_job.pid)
    victim = job.ranks[1].pid
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: proc_state(victim) is None, 30, "the killed rank to be reaped")
    job, stacks, errors = capture_job(job, DumpOptions(timeout=30))
    assert [(e.rank, e.kind) for e in errors] == [(1, "process_exited")]
    assert errors[0].fix
    report = analyze(job, stacks, errors)
    assert [s.rank for s in report.stacks if s.threads] == [0]  # rank 0 still captured
    assert report.job.exited_ranks == [1]
    assert report.verdict.kind == "missing_ranks" and report.verdict.suspect_ranks == [1]


def test_permission_denied_real_cli_subprocess(fake_job: RunningJob) -> None:
    """The installed `rankscope` run as another user ('nobody') against our job."""
    assert os.geteuid() == 0, "this test needs root to drop to another user"
    out = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            str(RANKSCOPE),
            "stacks",
            "--pid",
            str(fake_job.pid),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"},
    )
    assert out.returncode == 2, out.stdout + out.stderr  # no answer: rankscope could not read the job
    assert "Traceback" not in out.stderr
    assert "permission denied" in out.stderr.lower()
    assert "CAP_SYS_PTRACE" in out.stderr and "ptrace_scope" in out.stderr


def test_hang_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import rankscope.commands.ps, rankscope.commands.stacks, rankscope.capabilities.stacks, rankscope.capabilities.discovery\n"
        "import rankscope.analysis.hang.stacks, rankscope.analysis.sizing.bound, rankscope.render.stacks\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
