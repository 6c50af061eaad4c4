"""Lines for a person: the text view of `rankscope ps` (typed on its model; pure)."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.analysis.ranges import rank_ranges
from rankscope.models.core import JobList


def render_jobs(model: JobList) -> Iterator[str]:
    """One block per job: launcher, world size, then one line per rank."""
    if not model.jobs:
        yield f"no distributed PyTorch jobs found on {model.host}"
    for job in model.jobs:
        pids = job.launcher_pids or ([job.launcher_pid] if job.launcher_pid else [])
        launcher = job.launcher + (
            f" pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids))}" if pids else ""
        )
        extra = "".join(
            [
                f", backend {job.backend}" if job.backend else "",
                f", attempt {job.attempt}" if job.attempt else "",
            ]
        )
        yield f"{job.job_id}  ({launcher}, world size {job.world_size or '?'}, host {', '.join(job.hosts)}{extra})"
        by_status: dict[str, list[int]] = {}
        for m in job.missing:
            by_status.setdefault(m.status.replace("_", " "), []).append(m.rank)
        if by_status:
            yield "  missing ranks: " + "; ".join(f"{rank_ranges(rs)} {st}" for st, rs in by_status.items())
        elif job.missing_ranks:
            yield f"  missing ranks: {rank_ranges(job.missing_ranks)}" + (
                f" (exited: {rank_ranges(job.exited_ranks)})" if job.exited_ranks else ""
            )
        for r in job.ranks:
            kids = f"  children {r.children}" if r.children else ""
            yield (
                f"  rank {r.rank if r.rank is not None else '?':>4}  local {r.local_rank if r.local_rank is not None else '?':>3}"
                f"  pid {r.pid:<8} {r.state:<12}" + (f" ({r.rank_source})" if r.rank_source else "") + kids
            )
        for note in job.notes:
            yield f"  note: {note}"
    for err in model.errors:
        yield f"warning: {err}"
