"""One host's part of a watch that runs on another host (a login node): ``rankscope watch --sampler``.

Started once per host, over ssh or in an ``srun --overlap`` step, it finds the job's ranks here (as
a multi-host live call's host does: by pid, job id, or the folder the watch was started in), then
streams one :class:`~rankscope.models.watch.HostSample` per interval: /proc counters and output
sizes only, nothing that pauses a rank. The first sample also says which job it found, its output
files and its collective timeout. It follows a restart of the job by its id, says so when the job's
ranks and launchers here are gone, and stops when its caller goes away (its parent changes: the
ssh session or the step ended), so no sampler outlives its watch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from rankscope.capabilities import discovery
from rankscope.capabilities.watch import find, job_command, read_timeout
from rankscope.capabilities.watch_sampler import HostSampler
from rankscope.errors import InvalidInput, RankscopeError
from rankscope.models.core import Job
from rankscope.models.watch import HostSample, SampledRank, WatchSelection
from rankscope.runtime import procfs


def pick(pid: int | None, job_id: str | None, here: str | None) -> Job:
    """The job this host samples, picked as a multi-host call's host picks it (a job id may be the
    Slurm job's: its ranks here)."""
    if job_id is not None:
        return find(WatchSelection(job_id=job_id))
    job, _, choices = discovery.pick_job(pid, None, here)
    if job is None:
        ids = ", ".join(c.job_id for c in choices)
        raise InvalidInput(
            f"several jobs run on {discovery.this_host()} and none was started in {here}: {ids}",
            fix="Pass --job ID to the watch (`rankscope ps` on the host lists them).",
        )
    return job


def _launchers(job: Job) -> list[int]:
    return [p for p in [*job.launcher_pids, job.launcher_pid] if p]


def _sampler(job: Job) -> HostSampler:
    return HostSampler(sorted(r.pid for r in job.ranks), extra=_launchers(job))


def _again(job: Job) -> Job | None:
    """The same job with new ranks (a restart), or None while there are none."""
    try:
        found = find(WatchSelection(), job.job_id)
    except RankscopeError:
        return None
    old = {r.pid for r in job.ranks}
    return found if found.ranks and not {r.pid for r in found.ranks} & old else None


def _first(job: Job, given_timeout: float | None, sampler: HostSampler) -> dict[str, object]:
    """What only the first line says: the job's output files, timeout and command line."""
    timeout = read_timeout(job, given_timeout)
    return {
        "files": sampler.files,
        "job_timeout_s": timeout.seconds,
        "job_timeout_source": timeout.source,
        "job_timeout_note": timeout.note,
        "command": job_command(job),
    }


def host_samples(
    pid: int | None, job_id: str | None, here: str | None, interval_s: float, job_timeout_s: float | None
) -> Iterator[HostSample]:
    """This host's samples of the job, one per ``interval_s``, until its ranks and launchers are gone
    (a last sample with ``ended``) or the caller that started this sampler went away."""
    job = pick(pid, job_id, here)
    sampler = _sampler(job)
    host = discovery.this_host()
    parent = os.getppid()
    extra: dict[str, object] = _first(job, job_timeout_s, sampler)
    while os.getppid() == parent:
        tick = time.monotonic()
        alive = sampler.alive()
        if not alive:
            newer = _again(job)
            if newer is not None:
                job, sampler = newer, _sampler(newer)
                alive = sampler.alive()
            elif not any(procfs.is_alive(p) for p in _launchers(job)):
                yield HostSample(host=host, t=tick, job_id=job.job_id, ended=True)
                return
        ranks = {r.pid: r.rank for r in job.ranks}
        got = sampler.sample()
        sample = HostSample(
            host=host,
            t=got.t,
            job_id=job.job_id,
            ranks=[
                SampledRank(pid=p, rank=ranks.get(p), cpu_s=r.cpu_s, state=r.state, wchan=r.wchan, io=r.io)
                for p, r in got.ranks.items()
            ],
            rank_pids=alive,
            output=got.output,
        )
        yield sample.model_copy(update=extra) if extra else sample
        extra = {}
        time.sleep(max(0.0, interval_s - (time.monotonic() - tick)))


__all__ = ["host_samples", "pick"]
