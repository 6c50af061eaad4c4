"""One host's cheap samples of a job, for the stall detector (:mod:`rankscope.analysis.hang.stall`).

Between incidents a watch reads only what costs the job nothing: each rank's (and its children's)
CPU time and state from /proc/PID/stat, its main thread's I/O counters and kernel wait, and the
size of the files its output goes to. No ptrace, no signal, nothing that pauses a rank. A host's
sampler is separate from the loop that calls it, so that one host's part of a watch can run on
that host alone.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from rankscope.analysis.hang.stall import JobSample, RankSample
from rankscope.runtime import procfs
from rankscope.runtime.proctree import ParentLinks, descendants

OUTPUT_FDS = ("1", "2")
"""The fds whose files count as a rank's output: stdout and stderr."""


def output_files(pids: Iterable[int]) -> list[str]:
    """The regular files the processes' stdout and stderr go to (a log file, torchrun's
    ``--log_dir`` files), each once: their growth is output, whoever reads the job's logs."""
    found: dict[str, None] = {}
    for pid in pids:
        for link, target in procfs.fd_targets(pid):
            if (
                os.path.basename(link) in OUTPUT_FDS
                and target.startswith("/")
                and not target.startswith("/dev/")
            ):
                found[target] = None
    return list(found)


def _size(file: str) -> int:
    try:
        return os.stat(file).st_size
    except OSError:
        return 0


def read_rank(pid: int) -> RankSample | None:
    """One process read once (None: gone, or a zombie)."""
    fields = procfs.stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    wait = procfs.kernel_wait(pid)
    return RankSample(
        pid=pid,
        cpu_s=procfs.cpu_of(fields),
        state=wait[0] if wait else fields[0],
        wchan=wait[1] if wait else "",
        io=procfs.io_counters(pid),
    )


class Sampler(Protocol):
    """What a watch's loop reads: this host's ranks (:class:`HostSampler`), or every host's, each
    streamed from a sampler on that host (:class:`rankscope.capabilities.watch_hosts.HostsSampler`)."""

    @property
    def pids(self) -> list[int]: ...

    @property
    def files(self) -> list[str]: ...

    def alive(self) -> list[int]: ...

    def sample(self) -> JobSample: ...


@dataclass
class HostSampler:
    """Samples the given ranks of one host (and their children, whose CPU counts too)."""

    pids: list[int]
    extra: list[int] = field(default_factory=list)
    """Other processes whose output counts (the launcher): never read for CPU."""
    files: list[str] = field(default_factory=list)
    links: ParentLinks = field(default_factory=ParentLinks)
    """The host's parent links, kept between samples: a sample reads the stat files of the
    processes new since the last one, not of every process on the host."""

    def __post_init__(self) -> None:
        self.files = output_files([*self.pids, *self.extra])

    def alive(self) -> list[int]:
        """The ranks still running (not zombies)."""
        return [p for p in self.pids if (f := procfs.stat_fields(p)) is not None and f[0] not in ("Z", "X")]

    def sample(self) -> JobSample:
        """Every rank and child read now, and the output files' sizes."""
        kids = self.links.children()
        ranks: dict[int, RankSample] = {}
        for pid in self.pids:
            for p in (pid, *descendants(pid, kids)):
                got = read_rank(p)
                if got is not None:
                    ranks[p] = got
        output = 0
        with contextlib.suppress(OSError):
            output = sum(_size(f) for f in self.files)
        return JobSample(t=time.monotonic(), ranks=ranks, output=output)


__all__ = ["HostSampler", "Sampler", "output_files", "read_rank"]
