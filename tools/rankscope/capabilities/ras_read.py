"""Ask NCCL's RAS service for the job's launch counts (``rankscope stacks --ras``), only when asked.

NCCL >= 2.24 listens on ``localhost:28028`` (or ``NCCL_RAS_ADDR``) on every node of an NCCL
job; :mod:`rankscope.runtime.ras_client` speaks its client protocol (NCCL ``src/ras/client.cc``).

Never by default: formatting a status report while communicators are being created has
crashed jobs on the NCCL versions current torch ships (NVIDIA/nccl#2346 on 2.29.7; #1718,
#1669, #1762, #1996 before it). It is therefore skipped while any rank is still creating
a communicator, and read twice a few seconds apart so that a count that moves (a straggler)
is not called a hang.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from rankscope.analysis.hang.ras import finding, parse_json, parse_text
from rankscope.analysis.hostlist import host_port
from rankscope.errors import InvalidInput
from rankscope.models.core import Job
from rankscope.models.ras import RasFinding, RasStatus
from rankscope.runtime import ras_client

log = logging.getLogger("rankscope.capabilities.ras_read")

DEFAULT_ADDR = ("localhost", 28028)
LEG_TIMEOUT_S = 5
"""What RAS waits for other nodes' answers (its own default); the socket waits that plus 10 s."""
CONFIRM_S = 3.0
"""Seconds between the two reads: counts that move in between belong to a straggler."""
MAX_ANSWER = 8 * 1024 * 1024


@dataclass(frozen=True)
class RasAnswer:
    """One read, or why there is none."""

    status: RasStatus | None
    error: str | None = None


def ras_address(environs: Mapping[int, Mapping[str, str]]) -> tuple[str, int] | None:
    """Where this node's RAS listens, from the ranks' ``NCCL_RAS_ADDR``; None when they turned it off."""
    for env in environs.values():
        if env.get("NCCL_RAS_ENABLE", "1").strip() == "0":
            return None
    for env in environs.values():
        where = host_port((env.get("NCCL_RAS_ADDR") or "").strip())
        if where is not None:
            return where
    return DEFAULT_ADDR


def query(host: str, port: int, timeout: float = LEG_TIMEOUT_S + 10.0) -> RasStatus:
    """One ``STATUS`` read, JSON where the server speaks it, else text."""
    try:
        text, json_ok = ras_client.status(
            host, port, leg_timeout=LEG_TIMEOUT_S, timeout=timeout, limit=MAX_ANSWER
        )
    except ras_client.NotRas as exc:
        raise InvalidInput(
            f"{host}:{port} is not NCCL RAS (it answered {exc.answer[:60]!r})",
            "Check NCCL_RAS_ADDR of the job; RAS needs NCCL >= 2.24.",
        ) from exc
    return parse_json(text) if json_ok else parse_text(text)


def _read(host: str, port: int) -> RasAnswer:
    try:
        return RasAnswer(query(host, port))
    except InvalidInput as exc:
        return RasAnswer(None, exc.message)
    except OSError as exc:
        return RasAnswer(None, f"NCCL RAS at {host}:{port}: {exc}")


def read_ras(
    job: Job, environs: Mapping[int, Mapping[str, str]], confirm_s: float = CONFIRM_S
) -> tuple[RasFinding | None, str]:
    """The finding of two RAS reads ``confirm_s`` apart, and a note for the report."""
    where = ras_address(environs)
    if where is None:
        return None, "NCCL RAS not read: the job runs with NCCL_RAS_ENABLE=0"
    host, port = where
    first = _read(host, port)
    if first.status is None:
        return None, f"NCCL RAS not read: {first.error}"
    time.sleep(confirm_s)
    second = _read(host, port)
    pid_rank = {p.pid: p.rank for p in job.ranks if p.rank is not None}
    result = finding(
        first.status, second.status, pid_rank=pid_rank, world_size=job.world_size, interval_s=confirm_s
    )
    reads = "twice" if second.status is not None else "once"
    return result, f"NCCL RAS read {reads} at {host}:{port} ({first.status.format})"


__all__ = ["RasAnswer", "query", "ras_address", "read_ras"]
