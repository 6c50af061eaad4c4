"""In-process probes for distributed training code.

``import rankscope.probe`` is cheap: no torch, no mcp, nothing heavy. Each
name loads its module on first use (the training process already has torch)::

    from rankscope.probe import check_consistency, print_all_ranks
    report = check_consistency(model, which="grads")
    print(report)  # a short summary; report.model_dump() holds every field
    watch = watch_consistency(model, every=50)  # then watch.step() each step: the first divergent step
    print_all_ranks(f"loss {loss.item():.4f}")

Every function works before and without ``init_process_group`` (it then acts
on this process alone), takes an optional process group, and never waits on
other ranks without a timeout (``RANKSCOPE_PROBE_TIMEOUT``, default 120 s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankscope.lazy import lazy_getattr

EXPORTS: dict[str, str] = {
    "print_all_ranks": "rankscope.probe.printing",
    "format_all_ranks": "rankscope.probe.printing",
    "check_consistency": "rankscope.probe.consistency",
    "local_fingerprints": "rankscope.probe.consistency",
    "watch_consistency": "rankscope.probe.consistency_watch",
    "placement_report": "rankscope.probe.placement",
    "dump": "rankscope.probe.dump",
    "enable_flight_recorder": "rankscope.probe.flight",
    "memory_report": "rankscope.probe.memory",
    "record_oom_snapshots": "rankscope.probe.memory",
}

__all__ = sorted(EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.probe.consistency import check_consistency as check_consistency
    from rankscope.probe.consistency import local_fingerprints as local_fingerprints
    from rankscope.probe.consistency_watch import watch_consistency as watch_consistency
    from rankscope.probe.dump import dump as dump
    from rankscope.probe.flight import enable_flight_recorder as enable_flight_recorder
    from rankscope.probe.memory import memory_report as memory_report
    from rankscope.probe.memory import record_oom_snapshots as record_oom_snapshots
    from rankscope.probe.placement import placement_report as placement_report
    from rankscope.probe.printing import format_all_ranks as format_all_ranks
    from rankscope.probe.printing import print_all_ranks as print_all_ranks


__getattr__ = lazy_getattr(__name__, EXPORTS)
