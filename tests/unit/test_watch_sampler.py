"""A watch's sample reads the host's process table incrementally (``proctree.ParentLinks``): the
same children as a full pass over /proc (``children_map``), a child started or ended between two
samples seen at the next one, an orphan found under its new parent, and no stat file of a process
already known read again until the periodic full pass. Real processes of our own, reaped after."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import pytest

from rankscope.capabilities.watch_sampler import HostSampler
from rankscope.runtime import procfs
from rankscope.runtime.proctree import ParentLinks, children_map, descendants

PARENT = (
    "import subprocess, sys, time\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(kid.pid, flush=True)\n"
    "sys.stdin.readline()\n"
)
"""A process that starts a child, prints its pid, and exits (leaving it an orphan) once told to."""


@pytest.fixture
def parent() -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    kid = int(proc.stdout.readline())
    try:
        yield proc, kid
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if procfs.is_alive(kid):
            os.kill(kid, 9)


def _sorted(kids: dict[int, list[int]]) -> dict[int, list[int]]:
    return {p: sorted(c) for p, c in kids.items()}


def test_kept_links_give_the_same_children_as_a_full_pass(parent: tuple[subprocess.Popen[str], int]) -> None:
    proc, kid = parent
    links = ParentLinks()
    links.children()
    again = links.children()
    assert kid in again[proc.pid]
    assert proc.pid in descendants(os.getpid(), again)
    full = children_map()
    assert _sorted(again).get(proc.pid) == _sorted(full).get(proc.pid)


def test_a_child_started_between_samples_is_seen_and_an_orphan_moves(
    parent: tuple[subprocess.Popen[str], int],
) -> None:
    proc, kid = parent
    links = ParentLinks()
    before = links.children()
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.DEVNULL)
    try:
        assert late.pid not in before.get(os.getpid(), [])
        assert late.pid in links.children()[os.getpid()]
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
        now = links.children()
        adopter = procfs.parent_of(kid)
        assert proc.pid not in now.get(os.getpid(), [])
        assert adopter is not None and adopter != proc.pid and kid in now[adopter]
    finally:
        late.kill()
        late.wait(timeout=30)


def test_known_processes_are_not_read_again_until_the_full_pass(
    monkeypatch: pytest.MonkeyPatch, parent: tuple[subprocess.Popen[str], int]
) -> None:
    reads: Counter[int] = Counter()
    real = procfs.parent_of

    def counted(pid: int) -> int | None:
        reads[pid] += 1
        return real(pid)

    monkeypatch.setattr("rankscope.runtime.proctree.parent_of", counted)
    _, kid = parent
    links = ParentLinks(full_every=3)
    links.children()
    links.children()
    assert reads[kid] == 1
    links.children()
    links.children()
    assert reads[kid] == 2


def test_a_sample_counts_a_ranks_children(parent: tuple[subprocess.Popen[str], int]) -> None:
    proc, kid = parent
    sampler = HostSampler([proc.pid])
    first, second = sampler.sample(), sampler.sample()
    assert {proc.pid, kid} <= set(first.ranks) and set(first.ranks) == set(second.ranks)
    assert second.ranks[kid].cpu_s >= first.ranks[kid].cpu_s
