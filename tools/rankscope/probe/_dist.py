"""The one place the probes talk to other ranks.

Choice: every exchange runs on a dedicated **gloo** process group created with
its own timeout (``RANKSCOPE_PROBE_TIMEOUT`` seconds, default 120), one per set
of ranks, cached. Why:

* a rank that never calls the probe makes the others fail after the timeout
  with ``ProbeTimeout`` instead of hanging until the job's own (often 10-30
  minute, or disabled) collective timeout;
* gloo moves the small pickled fingerprints on the CPU, so the probe never
  allocates GPU memory nor queues work behind the training stream on NCCL;
* ``use_local_synchronization=True`` lets a subgroup create its gloo twin
  without the ranks outside it taking part.

Without ``init_process_group`` (or with a world of one) everything acts
locally: the "gather" returns this rank's object alone.
"""

from __future__ import annotations

import atexit
import os
import socket
from datetime import timedelta
from typing import Any

from rankscope.errors import ProbeTimeout, TorchMissing

DEFAULT_TIMEOUT_S = 120.0
_groups: dict[tuple[int, tuple[int, ...], float], Any] = {}
# The probe's groups are the job's too: let them go before the interpreter tears down, as the job's
# own destroy_process_group() does for its groups. A gloo group still referenced here would
# otherwise be destroyed at shutdown, where its threads can end the process with SIGABRT
# ("terminate called without an active exception").
atexit.register(_groups.clear)


def torch_mod() -> Any:
    """Import torch lazily; the probe module itself never imports it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is in the test env
        raise TorchMissing(f"rankscope.probe needs torch: {exc}") from exc
    return torch


def is_distributed() -> bool:
    torch = torch_mod()
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())


def timeout_s() -> float:
    try:
        return float(os.environ.get("RANKSCOPE_PROBE_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def rank_and_world(group: Any = None) -> tuple[int, int]:
    """(global rank, size of the group); (0, 1) when not distributed."""
    if not is_distributed():
        return 0, 1
    dist = torch_mod().distributed
    return dist.get_rank(), dist.get_world_size(group)


def group_ranks(group: Any = None) -> list[int]:
    """Global ranks of ``group`` in group-rank order; [0] when not distributed."""
    if not is_distributed():
        return [0]
    dist = torch_mod().distributed
    if group is None:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def probe_group(group: Any = None) -> Any:
    """The cached gloo twin of ``group``, with the probe timeout."""
    dist = torch_mod().distributed
    ranks = tuple(group_ranks(group))
    t = timeout_s()
    key = (id(dist.group.WORLD), ranks, t)  # a new init_process_group gets new groups
    pg = _groups.get(key)
    if pg is None:
        whole = len(ranks) == dist.get_world_size()
        pg = dist.new_group(
            ranks=list(ranks),
            backend="gloo",
            timeout=timedelta(seconds=t),
            use_local_synchronization=not whole,
        )
        _groups[key] = pg
    return pg


def gather_objects(obj: Any, group: Any = None) -> dict[int, Any]:
    """One all_gather_object on the probe group: {global rank: object}, identical on every rank."""
    ranks = group_ranks(group)
    if not is_distributed() or len(ranks) == 1:
        return {ranks[0] if ranks else 0: obj}
    dist = torch_mod().distributed
    pg = probe_group(group)
    out: list[Any] = [None] * len(ranks)
    try:
        dist.all_gather_object(out, obj, group=pg)
    except RuntimeError as exc:
        raise ProbeTimeout(
            f"rank {dist.get_rank()}: the probe exchange with ranks {ranks} failed after up to {timeout_s():.0f}s: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    return dict(zip(ranks, out, strict=True))


def broadcast_tensor(tensor: Any, src: int, group: Any = None) -> None:
    """Broadcast a CPU tensor from global rank ``src`` on the probe group (in place)."""
    if not is_distributed() or len(group_ranks(group)) == 1:
        return
    dist = torch_mod().distributed
    try:
        dist.broadcast(tensor, src=src, group=probe_group(group))
    except RuntimeError as exc:
        raise ProbeTimeout(f"rank {dist.get_rank()}: probe broadcast from rank {src} failed: {exc}") from exc


def job_id() -> str | None:
    """What tells this run apart from another: the torchelastic run id, Slurm job, or MASTER_ADDR:PORT."""
    env = os.environ
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return run_id
    if env.get("SLURM_JOB_ID"):
        return (
            "slurm:" + env["SLURM_JOB_ID"] + (f".{env['SLURM_STEP_ID']}" if env.get("SLURM_STEP_ID") else "")
        )
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return None


def hostname() -> str:
    return socket.gethostname()
