"""Saved stacks (tests/data/stacks/files, captured from a real hung gloo job by its capture.sh):
py-spy text and JSON, with and without --native, and a torchrun log of faulthandler output."""

from __future__ import annotations

import pytest

from rankscope.analysis.hang.frames import is_user_frame, main_thread
from rankscope.analysis.hang.stack_files import (
    faulthandler,
    full_path,
    pyspy_text,
    rank_from_name,
    sniff,
    split_by_prefix,
)
from rankscope.models.core import RankStack
from tests.paths import DATA

FILES = DATA / "stacks" / "files"


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank3.txt", 3),
        ("rank_3", 3),
        ("rank-12.json", 12),
        ("stacks_rank_3.txt", 3),
        ("/logs/none_x/attempt_0/5/stderr.log", 5),
        ("pyspy-RANK7.txt", 7),
        ("framework.txt", None),
        ("stacks.txt", None),
    ],
)
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_pyspy_text_threads_frames_and_main() -> None:
    [(pid, threads)] = pyspy_text((FILES / "pyspy_text" / "rank2.txt").read_text())
    assert pid is not None
    stack = RankStack(rank=2, pid=pid, host="h", threads=threads)
    main = main_thread(stack)
    assert main is not None and main.name == "MainThread"
    assert [f.function for f in main.frames][:3] == [
        "barrier",
        "_exception_logger.<locals>.wrapper",
        "sync_metrics",
    ]
    assert not is_user_frame(main.frames[0])  # torch/... is a library even without the install prefix
    heartbeat = next(t for t in threads if t.name == "heartbeat")
    assert not is_user_frame(heartbeat.frames[0])  # threading.py is the stdlib


def test_pyspy_native_text_keeps_native_frames() -> None:
    [(_pid, threads)] = pyspy_text((FILES / "pyspy_native_text" / "rank-0.txt").read_text())
    main = next(t for t in threads if t.is_main)
    native = [f for f in main.frames if f.native]
    assert any(f.function == "c10d::Work::wait" for f in native)
    assert any(f.function.startswith("pybind11::") for f in native)  # parentheses inside the name


def test_pyspy_text_locals_are_read() -> None:
    text = 'Thread 7 (idle): "MainThread"\n    main (train.py:41)\n        Locals:\n            step: 3\n            loss: 0.5\n'
    [(_pid, threads)] = pyspy_text(text)
    assert [(v.name, v.repr) for v in threads[0].frames[0].locals or []] == [("step", "3"), ("loss", "0.5")]


def test_torchrun_log_splits_by_prefix_and_parses_faulthandler() -> None:
    per = split_by_prefix((FILES / "faulthandler_torchrun.log").read_text())
    assert sorted(per) == [0, 1, 2]
    threads = faulthandler(per[1])
    assert len(threads) == 1 and threads[0].is_main
    assert [f.function for f in threads[0].frames] == ["barrier", "wrapper", "helper", "<module>"]


def test_faulthandler_repeated_dump_keeps_the_last() -> None:
    one = 'Thread 0x00007f01 (most recent call first):\n  File "/a/train.py", line {n} in main\n'
    threads = faulthandler(one.format(n=1) + "Timeout (0:01:00)!\n" + one.format(n=2))
    assert [f.line for f in threads[0].frames] == [2]


def test_faulthandler_fatal_signal_with_current_thread() -> None:
    text = (
        "Fatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f02 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
        "Current thread 0x00007f01 (most recent call first):\n"
        '  File "/job/train.py", line 12 in step\n'
        '  File "/job/train.py", line 30 in <module>\n'
    )
    threads = faulthandler(text)
    main = next(t for t in threads if t.is_main)
    assert main.frames[0].function == "step"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("[]", "pyspy_json"),
        ('Process 1: python x.py\nThread 1 (idle): "MainThread"\n', "pyspy_text"),
        ("Thread 0x01 (most recent call first):\n", "faulthandler"),
        ("hello\nworld\n", "unknown"),
        ("[not json", "unknown"),
    ],
)
def test_sniff(text: str, kind: str) -> None:
    assert sniff(text) == kind


def test_full_path_puts_stdlib_and_libraries_under_a_prefix() -> None:
    assert "/python" in full_path("threading.py") and "site-packages" not in full_path("threading.py")
    assert full_path("multiprocessing/connection.py").startswith("/usr/lib/python")
    assert full_path("torch/nn/modules/module.py") == "/site-packages/torch/nn/modules/module.py"
    assert full_path("train.py") == "train.py"
    assert full_path("/abs/train.py") == "/abs/train.py"
