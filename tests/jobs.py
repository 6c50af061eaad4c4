"""Start real multi-rank jobs for tests, wait on readiness files, always reap.

Test programs signal readiness by creating ``$RANKSCOPE_TEST_READY/<name>``
(see ``mark_ready`` in tests/programs/_common.py). Nothing here sleeps a fixed
time: waits poll a condition with a deadline.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.runtime.proctree import descendants, reap_tree

PROGRAMS = Path(__file__).resolve().parent / "programs"
TAIL_CHARS = 3000
"""How much of a job's output a failed wait quotes: its last lines, where a rank says why it stopped."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    cond: Callable[[], bool],
    timeout: float,
    what: str,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll ``cond`` until true; after ``timeout`` seconds fail with what was awaited and ``detail()``
    (e.g. the job's last output), so that a wait that runs out says why, not only that it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    message = f"waited {timeout:.0f} s for {what}"
    if detail is not None:
        message += f"; {detail()}"
    raise TimeoutError(message)


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``text`` (a whole line first), for a failure message."""
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    return "..." + cut[cut.find("\n") + 1 :] if "\n" in cut else "..." + cut


def torchrun_argv(program: str, *launcher_args: str, args: Sequence[str] = ()) -> list[str]:
    """``python -m torch.distributed.run LAUNCHER_ARGS --monitor_interval=0.2 tests/programs/<program> ARGS``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launcher_args,
        "--monitor_interval=0.2",
        str(PROGRAMS / program),
        *args,
    ]


def run_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``python -m rankscope ARGS`` in a fresh interpreter (the real entry point), output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "rankscope", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a CPU gloo job on loopback, light on the 2-core machine."""
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
            "MASTER_ADDR": "127.0.0.1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(PROGRAMS) + os.pathsep + env.get("PYTHONPATH", ""),
        }
    )
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    if extra:
        env.update(extra)
    return env


@dataclass
class RunningJob:
    """A job started by a test. ``pid`` is the launcher (torchrun or the spawn parent)."""

    proc: subprocess.Popen[bytes]
    ready_dir: Path
    log_path: Path
    nproc: int
    port: int
    extra_pids: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready_names(self) -> list[str]:
        return sorted(p.name for p in self.ready_dir.iterdir())

    def wait_ready(self, names: Sequence[str] | int | None = None, timeout: float = 60.0) -> None:
        """Wait until the named readiness files exist (an int: that many files); on timeout, fail
        with the files still missing and the job's last output."""
        want = self.nproc if names is None else names

        def ok() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"job exited with {self.proc.returncode} before ready:\n{self.output()}")
            have = set(self.ready_names())
            return len(have) >= want if isinstance(want, int) else set(want) <= have

        def detail() -> str:
            have = self.ready_names()
            if isinstance(want, int):
                return f"{len(have)} of {want} marked ready ({have}); {self.last_output()}"
            return f"still missing {[n for n in want if n not in have]} (have {have}); {self.last_output()}"

        wait_for(ok, timeout, f"the ranks' readiness files in {self.ready_dir}", detail=detail)

    def wait_exit(self, timeout: float, what: str) -> int:
        """Wait until the job exits; its exit code. On timeout, fail with ``what`` and its last output."""
        wait_for(lambda: self.proc.poll() is not None, timeout, what, detail=self.last_output)
        return int(self.proc.returncode)

    def last_output(self) -> str:
        """Whether the job still runs and its last output, for a failure message."""
        state = "still running" if self.proc.poll() is None else f"exited with {self.proc.returncode}"
        return f"the job (pid {self.pid}) is {state}; its last output:\n{tail(self.output())}"

    def rank_pids(self) -> list[int]:
        return descendants(self.pid)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Kill the job's whole tree at once. A test job needs no clean exit, and torchrun takes about
        4 s to exit on SIGTERM: a grace period would cost every live test that much at teardown."""
        reap_tree(self.proc, grace=0.0)


class JobFactory:
    """Starts jobs and reaps every one of them at teardown, pass or fail."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.jobs: list[RunningJob] = []

    def _start(
        self,
        argv: list[str],
        nproc: int,
        port: int,
        env: dict[str, str] | None,
        tag: str,
        cwd: Path | None = None,
    ) -> RunningJob:
        ready = self.tmp / f"ready-{tag}-{len(self.jobs)}"
        ready.mkdir()
        log = self.tmp / f"job-{tag}-{len(self.jobs)}.log"
        full_env = job_env({"RANKSCOPE_TEST_READY": str(ready), "MASTER_PORT": str(port), **(env or {})})
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
                cwd=str(cwd or PROGRAMS),
            )
        job = RunningJob(proc=proc, ready_dir=ready, log_path=log, nproc=nproc, port=port)
        self.jobs.append(job)
        return job

    def start(
        self,
        argv: list[str],
        nproc: int,
        port: int,
        env: dict[str, str] | None = None,
        tag: str = "custom",
        cwd: Path | None = None,
    ) -> RunningJob:
        """Start any command line (e.g. a custom torchrun invocation) as a reaped job, in ``cwd``
        (default: tests/programs)."""
        return self._start(argv, nproc, port, env, tag, cwd)

    def torchrun(
        self, program: str, nproc: int = 2, args: Sequence[str] = (), env: dict[str, str] | None = None
    ) -> RunningJob:
        """``python -m torch.distributed.run --nproc_per_node=N tests/programs/<program> args``."""
        port = free_port()
        argv = torchrun_argv(
            program,
            f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            args=args,
        )
        return self._start(argv, nproc, port, env, "torchrun")

    def torchrun_node(
        self,
        program: str,
        node_rank: int,
        nproc: int,
        port: int,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> RunningJob:
        """One agent of a two-node torchrun job on this host (both agents share ``port``), started in
        ``cwd`` (default: tests/programs)."""
        argv = torchrun_argv(
            program,
            "--nnodes=2",
            f"--node_rank={node_rank}",
            f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            args=args,
        )
        return self._start(argv, nproc, port, env, f"node{node_rank}", cwd)

    def python(
        self,
        program: str,
        nproc: int = 2,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> RunningJob:
        """``python tests/programs/<program> args`` for programs that launch ranks themselves (mp.spawn),
        started in ``cwd`` (default: tests/programs)."""
        port = free_port()
        argv = [sys.executable, str(PROGRAMS / program), *args]
        env = {"WORLD_SIZE_HINT": str(nproc), **(env or {})}
        return self._start(argv, nproc, port, env, "python", cwd)

    def cleanup(self) -> None:
        for job in self.jobs:
            job.stop()
