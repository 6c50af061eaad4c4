"""The window's new readings on a fake /proc: each rank's main-thread I/O at both ends, its kernel
wait read a bounded number of times, its own frames' locals at both looks; and the readers
themselves (runtime/procfs) on the layout of /proc/PID/task/TID/{io,stat,wchan}."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rankscope.capabilities import progress_watch
from rankscope.models.core import Frame, LocalVar, RankProcess, ThreadStack
from rankscope.runtime import procfs

PID = 4242
IO = "rchar: {r}\nwchar: {w}\nsyscr: 3\nsyscw: {c}\nread_bytes: 0\nwrite_bytes: {w}\ncancelled_write_bytes: 0\n"


def fake_proc(root: Path, wchar: int, state: str = "S", wchan: str = "hrtimer_nanosleep") -> None:
    task = root / str(PID) / "task" / str(PID)
    task.mkdir(parents=True, exist_ok=True)
    (task / "io").write_text(IO.format(r=100, w=wchar, c=wchar // 4096 + 1))
    (root / str(PID) / "io").write_text(IO.format(r=100, w=wchar + 8192, c=1))
    (task / "stat").write_text(f"{PID} (python (rank 0)) {state} 1 2 3")
    (task / "wchan").write_text(wchan)
    (root / str(PID) / "stat").write_text(f"{PID} (python) {state} " + " ".join(["0"] * 10) + " 100 20 0 0")


def test_procfs_reads_the_main_threads_io_and_kernel_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procfs, "PROC", tmp_path)
    fake_proc(tmp_path, wchar=5 << 20)
    io = procfs.io_counters(PID)
    assert io is not None and io["wchar"] == 5 << 20 and io["process_write_bytes"] == (5 << 20) + 8192
    assert "cancelled_write_bytes" not in io and "process_wchar" not in io
    assert procfs.kernel_wait(PID) == ("S", "hrtimer_nanosleep")
    (tmp_path / str(PID) / "task" / str(PID) / "wchan").write_text("0")
    assert procfs.kernel_wait(PID) == ("S", "")  # running, or the name hidden
    assert procfs.io_counters(PID + 1) is None and procfs.kernel_wait(PID + 1) is None


def test_the_window_reads_io_kernel_waits_and_locals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procfs, "PROC", tmp_path)
    fake_proc(tmp_path, wchar=1000)
    monkeypatch.setattr(progress_watch.pyspy, "start_record", lambda *a, **k: object())
    monkeypatch.setattr(progress_watch.pyspy, "stop_record", lambda *a, **k: "")
    window = progress_watch.Window.open([PID], "py-spy")

    def look(line: int, written: str) -> list[ThreadStack]:
        frame = Frame(
            function="save",
            file="/job/ckpt.py",
            line=line,
            locals=[LocalVar(name="written", repr=written), LocalVar(name="path", repr="'/ckpt/0.pt'")],
        )
        return [ThreadStack(thread_id=PID, is_main=True, frames=[frame])]

    window.first_look(PID, look(33, "0"))
    window.sample([RankProcess(pid=PID, rank=0, host="h")], {PID: "sleeping"})
    fake_proc(tmp_path, wchar=1000 + (5 << 20), state="D", wchan="folio_wait_bit")
    started = time.monotonic()
    watches, _ = window.close(started + 0.3, lambda pids: {PID: look(35, "5242880")})
    assert time.monotonic() - started >= 0.3  # the window lasts as asked
    (watch,) = watches
    assert watch.io[-1]["wchar"] - watch.io[0]["wchar"] == 5 << 20
    assert 1 <= len(watch.kernel) <= progress_watch.KERNEL_LOOKS + 1
    assert watch.kernel[0] == ("D", "folio_wait_bit")
    assert [r["ckpt.py:save:written"] for r in watch.reprs] == ["0", "5242880"]


def test_a_window_with_no_rank_to_read_still_lasts_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    window = progress_watch.Window(exe="py-spy")
    started = time.monotonic()
    watches, _ = window.close(started + 0.2, lambda pids: {})
    assert watches == [] and time.monotonic() - started >= 0.2
