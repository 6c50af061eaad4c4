"""Reaping a process tree whose members live in other sessions (as torchrun's workers do)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rankscope.runtime.proctree import _alive, descendants, reap_tree
from tests.jobs import wait_for

TREE = """
import os, subprocess, sys, pathlib
kids = [subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(1)'], start_new_session=True)
        for _ in range(2)]
pathlib.Path(sys.argv[1]).write_text(' '.join(str(k.pid) for k in kids))
while True:
    import time; time.sleep(1)
"""


def test_reap_tree_reaches_children_in_other_sessions(tmp_path: Path) -> None:
    ready = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", TREE, str(ready)], start_new_session=True)
    try:
        wait_for(ready.exists, 30, "child pids")
        kids = [int(p) for p in ready.read_text().split()]
        assert set(kids) <= set(descendants(proc.pid))
    finally:
        reap_tree(proc, grace=2.0)
    assert proc.poll() is not None
    for kid in kids:
        wait_for(lambda k=kid: not _alive(k), 10, f"child {kid} gone")  # type: ignore[misc]


def test_an_unreaped_child_says_how_it_ended() -> None:
    """A rank that exited and its launcher has not reaped: /proc still tells its exit code or signal."""
    import os
    import signal as _signal

    from rankscope.runtime.procfs import exit_status, read_stat
    from tests.jobs import wait_for

    exited = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        killed.send_signal(_signal.SIGKILL)
        for p in (exited, killed):
            wait_for(lambda p=p: (read_stat(p.pid) or (0, "", 0))[1] == "zombie", 30, "a zombie")
        assert exit_status(exited.pid) == "exit code 3"
        assert exit_status(killed.pid) == "killed by SIGKILL"
        assert exit_status(os.getpid()) is None  # running
    finally:
        for p in (exited, killed):
            p.kill()
            p.wait(timeout=30)
    assert exit_status(exited.pid) is None  # reaped: gone
