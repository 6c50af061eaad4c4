"""The py-spy runner against real processes: dumps, locals, and every failure kind."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope.errors import PySpyNotFound
from rankscope.options import DumpOptions
from rankscope.runtime.pyspy import DumpFailed, check_pyspy, classify_error, dump, find_pyspy, pyspy_version

WAITER = """
import sys, threading
def wait_here(api_token, count):
    print("ready", flush=True)
    sys.stdin.read()
threading.Thread(target=lambda: threading.Event().wait(), name="side", daemon=True).start()
wait_here("tok-" + "x" * 12, 3)
"""

# Real py-spy 0.4.3 stderr texts (trimmed of their Rust backtraces).
EXITED = """Error: Failed to get process executable name. Check that the process is running.

Caused by:
    0: No such file or directory (os error 2)
    1: No such file or directory (os error 2)
"""
DENIED_EXE = """Error: Failed to get process executable name. Check that the process is running.

Caused by:
    0: Permission denied (os error 13)
    1: Permission denied (os error 13)
"""
DENIED_PTRACE = (
    "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'\n"
)
NOT_PYTHON = "Error: Failed to find python version from target process\n"


@pytest.fixture
def waiter() -> Iterator[subprocess.Popen[str]]:
    """A real Python process blocked in a function with arguments, plus a side thread."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_finds_a_recent_pyspy(pyspy_works: str) -> None:
    exe = check_pyspy()
    assert os.access(exe, os.X_OK)
    assert pyspy_version(exe) >= (0, 3, 14)


def test_dump_returns_all_threads_with_the_main_one_marked(
    waiter: subprocess.Popen[str], pyspy_works: str
) -> None:
    threads = dump(waiter.pid, DumpOptions(timeout=30))
    assert {t.name for t in threads} >= {"MainThread", "side"}
    main = [t for t in threads if t.is_main]
    assert len(main) == 1 and main[0].os_thread_id == waiter.pid
    functions = [f.function for f in main[0].frames]
    assert "wait_here" in functions
    assert all(not f.native for f in main[0].frames)


def test_dump_with_locals_and_native(waiter: subprocess.Popen[str], pyspy_works: str) -> None:
    threads = dump(waiter.pid, DumpOptions(locals=True, native=True, timeout=60))
    main = next(t for t in threads if t.is_main)
    frame = next(f for f in main.frames if f.function == "wait_here")
    assert frame.locals is not None
    args = {v.name: v.repr for v in frame.locals if v.arg}
    assert args["count"] == "3"
    assert "api_token" in args  # raw here: rankscope.capabilities.stacks redacts before anything leaves
    assert any(f.native for f in main.frames)


def test_not_a_python_process_is_unsupported(pyspy_works: str) -> None:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        with pytest.raises(DumpFailed) as info:
            dump(proc.pid, DumpOptions(timeout=30))
        assert info.value.kind == "unsupported"
        assert "py-spy" in info.value.fix
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_exited_process(pyspy_works: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    with pytest.raises(DumpFailed) as info:
        dump(proc.pid, DumpOptions(timeout=30))
    assert info.value.kind == "process_exited"
    assert "rankscope ps" in info.value.fix


def test_timeout_is_reported_as_such(waiter: subprocess.Popen[str], pyspy_works: str) -> None:
    with pytest.raises(DumpFailed) as info:
        dump(waiter.pid, DumpOptions(native=True, timeout=0.001))
    assert info.value.kind == "timeout"
    assert "--timeout" in info.value.fix


def test_permission_denied_for_another_user(waiter: subprocess.Popen[str], pyspy_works: str) -> None:
    """py-spy run as 'nobody' against our process: a real ptrace refusal."""
    assert os.geteuid() == 0, "this test needs root to drop to another user"
    code = (
        "from rankscope.options import DumpOptions\n"
        "from rankscope.runtime.pyspy import dump, DumpFailed\n"
        f"try:\n    dump({waiter.pid}, DumpOptions(timeout=30))\n"
        "except DumpFailed as e:\n    print(e.kind)\n    print(e.fix)\n"
    )
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"},
    )
    kind, _, fix = out.stdout.partition("\n")
    assert kind == "permission_denied", out.stdout + out.stderr
    assert "CAP_SYS_PTRACE" in fix and "ptrace_scope" in fix


def test_classify_real_error_texts() -> None:
    assert classify_error(EXITED, 5, alive=False)[0] == "process_exited"
    assert classify_error(DENIED_EXE, 5, alive=True)[0] == "permission_denied"
    assert classify_error(DENIED_PTRACE, 5, alive=True)[0] == "permission_denied"
    assert classify_error(NOT_PYTHON, 5, alive=True)[0] == "unsupported"
    kind, message = classify_error("Error: something new\n", 5, alive=True)
    assert kind == "failed" and "something new" in message


def test_missing_pyspy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.delenv("RANKSCOPE_PYSPY", raising=False)
    with pytest.raises(PySpyNotFound) as info:
        find_pyspy()
    assert "pip install py-spy" in info.value.render()
    monkeypatch.setenv("RANKSCOPE_PYSPY", str(tmp_path / "nope"))
    with pytest.raises(PySpyNotFound, match="RANKSCOPE_PYSPY"):
        find_pyspy()


def test_explicit_pyspy_path(monkeypatch: pytest.MonkeyPatch, pyspy_works: str) -> None:
    monkeypatch.setenv("RANKSCOPE_PYSPY", pyspy_works)
    assert find_pyspy() == pyspy_works
