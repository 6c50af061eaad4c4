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
import sys
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
    proc = start_stream(argv, env)  # the same start; bounded here by the wait below
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


DETACH_TRAMPOLINE = """
import os, sys
pid = os.fork()
if pid:
    sys.stdout.write(str(pid))
    sys.stdout.flush()
    os._exit(0)
os.dup2(2, 1)
os.execve(sys.argv[1], sys.argv[1:], os.environ)
"""
"""Run in a fresh interpreter (single-threaded, so forking there is safe): fork, say the child's pid,
exit; the child puts its stdout on the log (its stderr) and becomes the command."""

DETACH_TIMEOUT = 30.0


def start_stream(argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a long-lived helper whose stdout the caller reads line by line (a watch's sampler on
    another host, over ssh or an ``srun --overlap`` step); its stderr piped too, stdin closed.

    Not bounded here: the caller reads it with a staleness limit and reaps its tree with
    :func:`rankscope.runtime.proctree.reap_tree` when it goes quiet or the watch ends. It runs in a
    session of its own. Raises OSError when it cannot start."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=dict(env) if env is not None else None,
    )


def start_detached(
    argv: list[str], log_path: str, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> int:
    """Start ``argv`` detached from this process and its terminal; its pid.

    A double fork with a new session in between: a trampoline started in a session of its own
    forks the command and exits, so the command is nobody's child here (it never becomes this
    process's zombie, and a long-lived caller such as the MCP server needs not reap it), outlives
    the caller, and, not being a session leader, never gets a controlling terminal. The forks
    happen in the trampoline, never in this process (which may run threads). stdin is /dev/null,
    stdout and stderr append to ``log_path`` (created 0600). Not bounded here: what it runs (a
    watch) bounds itself and stops when its job ends. Raises OSError when it cannot start.
    """
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        trampoline = subprocess.Popen(
            [sys.executable, "-c", DETACH_TRAMPOLINE, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_fd,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    finally:
        os.close(log_fd)
    try:
        out, _ = trampoline.communicate(timeout=DETACH_TIMEOUT)
    except subprocess.TimeoutExpired:
        reap_tree(trampoline, grace=REAP_GRACE)
        raise OSError(f"could not start {argv[0]} detached in {DETACH_TIMEOUT:g}s") from None
    if trampoline.returncode != 0 or not out.strip().isdigit():
        raise OSError(f"could not start {argv[0]} detached (exit {trampoline.returncode})")
    return int(out)


def _text(data: bytes | None) -> str:
    return (data or b"").decode(errors="replace")


__all__ = ["Completed", "run", "start_job"]
