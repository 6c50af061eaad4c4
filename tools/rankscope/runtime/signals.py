"""Signals to processes rankscope did not start: a request to a rank, never a blow.

A rank that runs ``rankscope.probe.enable_flight_recorder`` dumps its recorder on a signal, from
a thread, while training goes on. The same signal to a rank without that handler would run the
signal's default action (for SIGUSR1: the process ends), so the handler is checked in
``/proc/PID/status`` (``SigCgt``) first, and nothing is sent without one. Reaping what rankscope
started is :mod:`rankscope.runtime.proctree`'s.
"""

from __future__ import annotations

import os

from rankscope.runtime import procfs


def send_if_handled(pid: int, signum: int) -> str | None:
    """Send ``signum`` to ``pid`` only when the process has a handler for it; None once sent,
    else why not (no handler installed, the process is gone or not ours)."""
    if signum not in procfs.caught_signals(pid):
        return f"signal {signum} is not caught"
    try:
        os.kill(pid, signum)
    except OSError as exc:
        return f"it cannot be signalled: {exc}"
    return None


__all__ = ["send_if_handled"]
