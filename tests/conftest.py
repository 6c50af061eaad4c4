"""Shared fixtures: real jobs that are always reaped, and a ptrace check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs import JobFactory
from tests.nodes import Nodes, nodes_up
from tests.order import CostRecorder, longest_files_first
from tests.paths import ROOT


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist hands out files by their number of tests unless told not to, which undoes the
    # longest-first order below (tests/order.py)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if os.environ.get("RANKSCOPE_FILE_COSTS") == "write":
        config.pluginmanager.register(CostRecorder(ROOT), "rankscope-file-costs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (tests/order.py): the test processes end together."""
    longest_files_first(items, ROOT)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[JobFactory]:
    """Start jobs with ``jobs.torchrun(...)`` / ``jobs.python(...)``; all are reaped at teardown."""
    factory = JobFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture(scope="module")
def module_jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobFactory]:
    """Like ``jobs``, for a job several tests of a module only read (one start instead of several:
    most of a live test's cost on 2 cores); all are reaped at the module's end."""
    factory = JobFactory(tmp_path_factory.mktemp("module-jobs"))
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Two hosts that really are apart (tests/nodes.py: node1, node2, each its own PID and UTS
    namespace and sshd), shared by a module's tests and stopped, with all they run, at its end."""
    up = nodes_up(tmp_path_factory.mktemp("nodes"), 2)
    try:
        yield up
    finally:
        up.down()


@pytest.fixture(scope="session")
def pyspy_works() -> str:
    """Fail loudly (not skip) when py-spy cannot attach here: the suite needs ptrace."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # its interpreter is up once it prints (before that py-spy finds no Python in it); it prints
        # or exits, so the read ends either way
        assert child.stdout is not None and child.stdout.readline() == "ready\n", "python did not start"
        out = subprocess.run(
            [exe, "dump", "--pid", str(child.pid)], capture_output=True, text=True, timeout=30
        )
    finally:
        child.kill()
        child.wait(timeout=5)
    assert out.returncode == 0, f"py-spy cannot attach here (ptrace not allowed?): {out.stderr}"
    return exe


@pytest.fixture(autouse=True)
def _own_capture_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test keeps its stacks captures (``--last``) apart: other tests and other users' runs on
    the host write theirs too, and a test must read back only its own."""
    monkeypatch.setenv("RANKSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("rankscope-cache")))
