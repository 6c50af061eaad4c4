"""Each rank's GPU utilisation, from nvidia-smi (two queries, each with a timeout).

Only asked for on jobs that may use a GPU; a host without nvidia-smi, or one that does not
answer in time, gives nothing and the verdict goes on without it. Read-only: nvidia-smi
queries NVML and never touches the job.
"""

from __future__ import annotations

import logging
import shutil

from rankscope.analysis.hang.gpu_busy import APPS_QUERY, GPU_QUERY, parse_apps, parse_gpus, rank_utilisation
from rankscope.models.core import Job
from rankscope.runtime import procfs, subproc

log = logging.getLogger("rankscope.capabilities.gpu_read")

SMI_TIMEOUT = 10.0


def _query(exe: str, flag: str) -> str | None:
    try:
        out = subproc.run([exe, flag, "--format=csv,noheader,nounits"], SMI_TIMEOUT)
    except OSError as exc:
        log.info("nvidia-smi could not run: %s", exc)
        return None
    if out.timed_out or out.rc != 0:
        log.info("nvidia-smi %s gave nothing (rc %s, timed out %s)", flag, out.rc, out.timed_out)
        return None
    return out.stdout


def gpu_utilisation(job: Job) -> dict[int, int]:
    """rank -> utilisation % of its GPU; {} without nvidia-smi or on a job that runs gloo alone."""
    if job.backend == "gloo":
        return {}
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    gpus_text = _query(exe, f"--query-gpu={GPU_QUERY}")
    if not gpus_text:
        return {}
    apps_text = _query(exe, f"--query-compute-apps={APPS_QUERY}") or ""
    pids = {r.rank: r.pid for r in job.ranks if r.rank is not None}
    fds = {rank: procfs.device_fds(pid, "/dev/nvidia") for rank, pid in pids.items()}
    return rank_utilisation(parse_gpus(gpus_text), parse_apps(apps_text), pids, fds)


__all__ = ["gpu_utilisation"]
