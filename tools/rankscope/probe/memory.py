"""In-job memory probes: every rank's counters in one gather, and OOM snapshots.

``memory_report()`` collects this rank's CUDA allocator counters
(``torch.cuda.memory_stats``: allocated / reserved / peaks / allocation
retries / OOMs) and host RSS, then exchanges them in one ``all_gather_object``
on the probe's gloo group (with the probe timeout, see ``_dist``), so every
rank returns the same report. Without ``init_process_group`` it reports this
process alone.

``record_oom_snapshots(dir)`` turns on allocator history and registers
PyTorch's out-of-memory observer, which runs *before* the OOM exception
unwinds the stack and frees the tensors that filled memory: the snapshot it
writes shows the memory as it was when the allocation failed.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import warnings
from pathlib import Path
from typing import Any

from rankscope.analysis.memory import parse_kb_fields, probe_report
from rankscope.models.memory import MemoryProbeReport, RankMemoryStats
from rankscope.probe import _dist
from rankscope.runtime import procfs

log = logging.getLogger("rankscope.probe.memory")


def _host_memory() -> tuple[int | None, int | None]:
    """(RSS, peak RSS) of this process in bytes."""
    rss: int | None = None
    peak: int | None = None
    try:
        fields = parse_kb_fields(procfs.own_text("status"))
        rss, peak = fields.get("VmRSS"), fields.get("VmHWM")
    except OSError:
        pass
    if peak is None:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB on Linux
    return rss, peak


def local_memory_stats(rank: int = 0) -> RankMemoryStats:
    """This process's counters: CUDA allocator stats when CUDA is in use, host RSS always."""
    torch = _dist.torch_mod()
    rss, peak_rss = _host_memory()
    stats = RankMemoryStats(
        rank=rank,
        device="cpu",
        rss_bytes=rss,
        peak_rss_bytes=peak_rss,
        host=_dist.hostname(),
        pid=os.getpid(),
    )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        dev = torch.cuda.current_device()
        s = torch.cuda.memory_stats(dev)
        stats.device = f"cuda:{dev}"
        stats.allocated_bytes = int(s.get("allocated_bytes.all.current", 0))
        stats.reserved_bytes = int(s.get("reserved_bytes.all.current", 0))
        stats.peak_allocated_bytes = int(s.get("allocated_bytes.all.peak", 0))
        stats.peak_reserved_bytes = int(s.get("reserved_bytes.all.peak", 0))
        stats.alloc_retries = int(s.get("num_alloc_retries", 0))
        stats.num_ooms = int(s.get("num_ooms", 0))
    return stats


def memory_report(group: Any = None) -> MemoryProbeReport:
    """Every rank's memory counters (same report on every rank); this rank alone without a process group.

    Call it on all ranks of ``group`` at the same point: it is one collective
    on the probe's gloo group and fails with ``ProbeTimeout`` if a rank never
    joins.
    """
    rank, world = _dist.rank_and_world(group)
    mine = local_memory_stats(rank)
    gathered = _dist.is_distributed() and world > 1
    if not gathered:
        return probe_report([mine], world_size=world, gathered=False)
    by_rank = _dist.gather_objects(mine.model_dump(mode="json"), group)
    stats = [RankMemoryStats.model_validate(v) for v in by_rank.values()]
    return probe_report(stats, world_size=world, gathered=True)


def _this_rank() -> int:
    if _dist.is_distributed():
        return int(_dist.torch_mod().distributed.get_rank())
    env = os.environ.get("RANK", "0")
    return int(env) if env.isdigit() else 0


def record_oom_snapshots(dir: str, *, max_entries: int = 100_000) -> str | None:
    """Record allocator history and write ``dir/snapshot-rank<R>.pickle`` when this rank hits a CUDA OOM.

    Returns the path the snapshot will be written to, or None when CUDA is not
    available: then it warns (``RuntimeWarning``) and records nothing, since
    host memory has no allocator history to snapshot. ``max_entries`` bounds
    the trace ring buffer (each entry is several hundred bytes with frames).
    """
    torch = _dist.torch_mod()
    if not torch.cuda.is_available():
        msg = (
            "rankscope.probe.record_oom_snapshots needs CUDA: torch.cuda is not available here, so no allocator "
            "history is recorded and no snapshot will be written (host memory: use memory_report())."
        )
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        log.warning(msg)
        return None
    out_dir = Path(dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    target = out_dir / f"snapshot-rank{_this_rank()}.pickle"

    def _on_oom(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        # Runs inside the allocator before the OOM exception unwinds; never raise from here.
        path = out_dir / f"snapshot-rank{_this_rank()}.pickle"
        tmp = path.with_suffix(".pickle.tmp")
        try:
            torch.cuda.memory._dump_snapshot(str(tmp))
            os.replace(tmp, path)
            sys.stderr.write(
                f"rankscope: CUDA OOM on device {device} (request {alloc} bytes); snapshot written to {path}\n"
            )
        except Exception as exc:  # pragma: no cover - disk full etc.
            sys.stderr.write(f"rankscope: could not write the OOM snapshot {path}: {exc}\n")

    torch._C._cuda_attach_out_of_memory_observer(_on_oom)
    return str(target)
