"""Bounded runs of helper commands (nvidia-smi, dmesg, ssh, srun, kubectl, a torch probe), and the
start of a job rankscope launches and watches (``start_job``).

rankscope must never hang on a tool it calls, and never leave one behind: the
command runs in its own session with a timeout, and on timeout its whole
process tree is reaped (``rankscope.runtime.proctree.reap_tree``: by parent links from
the pid started here, never by name). Output is decoded leniently, since a
remote host or a driver tool may print bytes that are not UTF-8.

py-spy has its own runner (``rankscope.runtime.pyspy``): its failures need py-spy
specific classification.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

from rankscope.runtime.proctree import reap_tree

REAP_GRACE = 1.0  # seconds a timed-out command gets between SIGTERM and SIGKILL
DRAIN_TIMEOUT = 2.0  # seconds to collect what a reaped command had printed


@dataclass(frozen=True)
class Completed:
    """What a bounded run produced; ``rc`` is None when it timed out."""

    rc: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


def run(argv: list[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
    """Run ``argv`` (stdin closed) for at most ``timeout`` seconds and return its output.

    Raises OSError when the command cannot start (FileNotFoundError when it does
    not exist): callers word that for their own context. ``env`` replaces the
    environment when given. On timeout, the output printed so far is kept.
    """
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=dict(env) if env is not None else None,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        reap_tree(proc, grace=REAP_GRACE)
        out, err = b"", b""
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            out, err = proc.communicate(timeout=DRAIN_TIMEOUT)
        return Completed(None, _text(out), _text(err), True, time.monotonic() - t0)
    return Completed(proc.returncode, _text(out), _text(err), False, time.monotonic() - t0)


def start_job(
    argv: list[str], output: IO[bytes], env: Mapping[str, str] | None = None, cwd: str | None = None
) -> subprocess.Popen[bytes]:
    """Start a job rankscope watches (torchrun and its ranks), its stdout and stderr into ``output``.

    Not bounded here, unlike :func:`run`: the caller watches the job (its output, its ranks' CPU
    time, its own time limit) and reaps its tree with :func:`rankscope.runtime.proctree.reap_tree`
    whatever ends the watch. It runs in its own session, so a terminal's Ctrl-C reaches rankscope
    only and rankscope stops the job; stdin is closed. Raises OSError when it cannot start.
    """
    return subprocess.Popen(
        argv,
        stdout=output,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
    )


def start_detached(
    argv: list[str], log_path: str, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> int:
    """Start ``argv`` detached from this process and its terminal; its pid.

    A double fork with ``setsid`` in between: the command runs in a session of its own, is nobody's
    child here (so it never becomes this process's zombie, and a long-lived caller such as the MCP
    server needs not reap it), outlives the caller, and never gets a controlling terminal. stdin is
    /dev/null, stdout and stderr append to ``log_path`` (created 0600). Not bounded here: what it
    runs (a watch) bounds itself and stops when its job ends. Raises OSError when it cannot start.
    """
    full_env = dict(env) if env is not None else dict(os.environ)
    read_end, write_end = os.pipe()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    try:
        first = os.fork()
        if first == 0:  # pragma: no cover - runs in the forked child
            _detached_child(argv, full_env, cwd, read_end, write_end, log_fd, null_fd)
        os.close(write_end)
        os.waitpid(first, 0)
        with os.fdopen(read_end, "rb") as fh:
            raw = fh.read()
    finally:
        os.close(log_fd)
        os.close(null_fd)
    if not raw.strip().isdigit():
        raise OSError(f"could not start {argv[0]} detached")
    return int(raw)


def _detached_child(
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    read_end: int,
    write_end: int,
    log_fd: int,
    null_fd: int,
) -> None:  # pragma: no cover - runs in the forked child
    """The first child: a new session, the second fork, its pid written back, then exit; the
    grandchild execs ``argv`` with its stdio on /dev/null and the log."""
    try:
        os.close(read_end)
        os.setsid()
        second = os.fork()
        if second:
            os.write(write_end, str(second).encode())
            os._exit(0)
        os.close(write_end)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        if cwd:
            os.chdir(cwd)
        os.execve(argv[0], argv, env)
    except BaseException:
        os._exit(127)


def _text(data: bytes | None) -> str:
    return (data or b"").decode(errors="replace")


__all__ = ["Completed", "run", "start_job"]
