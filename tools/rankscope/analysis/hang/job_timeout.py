"""The job's own collective timeout, read from the job where it says it, and the thresholds a watch
derives from it.

A watch must capture a stall well before the job's watchdog aborts every rank and erases it. The
timeout is read from what the job shows from outside: its command line (the flags the common
trainers take), its environment, or a ``timeout`` local holding a ``timedelta`` (the call to
``init_process_group`` as its stacks show it); otherwise torch's default for the backend, said as such.

Pure: the shell hands in the argv, the environment and the locals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rankscope.models.watch import TimeoutSource

ARG_FLAGS: dict[str, float] = {
    "--dist-timeout": 1.0,
    "--dist_timeout": 1.0,
    "--ddp-timeout": 1.0,
    "--ddp_timeout": 1.0,
    "--nccl-timeout": 1.0,
    "--nccl_timeout": 1.0,
    "--collective-timeout": 1.0,
    "--distributed-timeout-minutes": 60.0,
    "--distributed_timeout_minutes": 60.0,
    "--timeout-minutes": 60.0,
}
"""Flags that set the collective timeout, and the seconds of one unit (Megatron's in minutes; the
HF Trainer's ``--ddp_timeout`` and most scripts' in seconds)."""

ENV_VARS: dict[str, float] = {
    "TORCH_DIST_TIMEOUT": 1.0,
    "TORCH_NCCL_TIMEOUT": 1.0,
    "NCCL_TIMEOUT": 1.0,
    "DIST_TIMEOUT": 1.0,
    "DEEPSPEED_TIMEOUT": 60.0,
}
"""Environment variables jobs and launchers use for it (DeepSpeed's in minutes)."""

TORCH_DEFAULTS: dict[str, float] = {"nccl": 600.0, "gloo": 1800.0}
"""torch's default ``init_process_group`` timeout per backend (NCCL 10 min, others 30 min)."""

_TIMEDELTA = re.compile(r"timedelta\((?:days=(\d+),?\s*)?(?:seconds=(\d+),?\s*)?(?:microseconds=\d+)?\)")


@dataclass(frozen=True)
class JobTimeout:
    """The timeout and where it was read (``args``, ``env``, ``stacks``, or ``default``)."""

    seconds: float
    source: TimeoutSource
    note: str


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


def from_args(argv: Sequence[str]) -> JobTimeout | None:
    """A timeout flag on the command line, ``--flag N`` or ``--flag=N``."""
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name not in ARG_FLAGS:
            continue
        raw = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        got = _number(raw)
        if got is not None:
            return JobTimeout(got * ARG_FLAGS[name], "args", f"{name} {raw} on the command line")
    return None


def from_env(env: Mapping[str, str]) -> JobTimeout | None:
    for name, unit in ENV_VARS.items():
        got = _number(env.get(name, ""))
        if got is not None:
            return JobTimeout(got * unit, "env", f"{name}={env[name]} in the ranks' environment")
    return None


def from_locals(values: Iterable[tuple[str, str]]) -> JobTimeout | None:
    """A local named ``timeout`` whose repr is a ``timedelta`` (``init_process_group(timeout=...)``)."""
    for name, text in values:
        if name != "timeout":
            continue
        m = _TIMEDELTA.search(text)
        if m and (m.group(1) or m.group(2)):
            seconds = int(m.group(1) or 0) * 86400 + int(m.group(2) or 0)
            if seconds > 0:
                return JobTimeout(float(seconds), "stacks", f"timeout={text} in the ranks' frames")
    return None


_INIT_CALL = re.compile(r"\b(?:init_process_group|init_device_mesh|new_group)\s*\(")
_SOURCE_DELTA = re.compile(
    r"\btimeout\s*=\s*(?:[\w.]*\.)?timedelta\s*\(\s*((?:\s*(?:days|hours|minutes|seconds)\s*=\s*[\d.]+\s*,?)+)\s*\)"
)
_UNITS = {"days": 86400.0, "hours": 3600.0, "minutes": 60.0, "seconds": 1.0}
_CALL_SPAN = 600
"""Characters after ``init_process_group(`` searched for its ``timeout=`` argument."""


def from_source(files: Iterable[tuple[str, str]]) -> JobTimeout | None:
    """``init_process_group(..., timeout=timedelta(seconds=30))`` in the job's own script, the way
    most jobs set it: literal units only (a value read from a flag or a config is not guessed)."""
    for name, text in files:
        for call in _INIT_CALL.finditer(text):
            m = _SOURCE_DELTA.search(text, call.end(), call.end() + _CALL_SPAN)
            if m is None:
                continue
            seconds = 0.0
            for part in m.group(1).split(","):
                unit, eq, value = part.partition("=")
                got = _number(value.strip()) if eq else None
                if got is not None and unit.strip() in _UNITS:
                    seconds += got * _UNITS[unit.strip()]
            if seconds > 0:
                line = text.count("\n", 0, call.start()) + 1
                return JobTimeout(
                    seconds, "source", f"timeout={m.group(0).split('=', 1)[1].strip()} at {name}:{line}"
                )
    return None


def job_timeout(
    argvs: Iterable[Sequence[str]],
    envs: Iterable[Mapping[str, str]],
    backend: str | None,
    sources: Iterable[tuple[str, str]] = (),
) -> JobTimeout:
    """The job's timeout from the first rank (or launcher) that states it on its command line or in
    its environment, else in its script's call to ``init_process_group``, else torch's default."""
    for argv in argvs:
        got = from_args(argv)
        if got is not None:
            return got
    for env in envs:
        got = from_env(env)
        if got is not None:
            return got
    got = from_source(sources)
    if got is not None:
        return got
    seconds = TORCH_DEFAULTS.get(backend or "", TORCH_DEFAULTS["nccl"])
    which = backend if backend in TORCH_DEFAULTS else "nccl (the shortest)"
    return JobTimeout(seconds, "default", f"not stated by the job: torch's default for {which}, {seconds:g}s")


def stall_threshold(timeout_s: float) -> float:
    """Seconds of quiet with idle ranks before a stall is suspected: a fifth of the job's timeout,
    at least 10 s (a slow phase) and at most 120 s (so the capture stays well inside it)."""
    return min(120.0, max(10.0, timeout_s * 0.2))


def busy_threshold(stall_s: float, timeout_s: float) -> float:
    """Seconds of quiet with busy ranks (NCCL spins) before a stall is suspected: three times the
    idle threshold, but no later than half the job's timeout."""
    return max(stall_s, min(3.0 * stall_s, timeout_s * 0.5))


__all__ = [
    "ARG_FLAGS",
    "ENV_VARS",
    "TORCH_DEFAULTS",
    "JobTimeout",
    "busy_threshold",
    "from_args",
    "from_env",
    "from_locals",
    "from_source",
    "job_timeout",
    "stall_threshold",
]
