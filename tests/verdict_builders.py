"""Hand-built facts for the hang rules' own tests (tests/unit/test_verdict_rules.py).

A rank is built as ``analysis.hang.stacks.annotate`` leaves it (its op, what it waits for, its call
site at ``train.py:<line>`` in ``main``), so a test says only what its rule reads, and the
facts come from the same ``facts`` the analysis calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rankscope.analysis.hang.stacks import group_by_op
from rankscope.analysis.hang.verdict import Facts, with_evidence
from rankscope.analysis.hang.verdict_facts import sort_ranks
from rankscope.models.core import (
    Backend,
    CallSite,
    Frame,
    Job,
    ProcState,
    RankError,
    RankStack,
    ThreadStack,
    WaitKind,
)
from rankscope.models.flight import FlightReport
from rankscope.models.ras import RasFinding

JOB_FILE = "/job/train.py"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def rank(
    r: int,
    op: str | None = None,
    *,
    line: int = 10,
    wait: WaitKind | None = None,
    state: ProcState = "running",
    stack: bool = True,
    **fields: Any,
) -> RankStack:
    """Rank ``r`` stopped at train.py:``line`` in ``main``, inside c10d's ``op`` when one is given;
    it waits in the collective when it is in one, else for neither (``wait`` says otherwise).
    ``fields`` are any other RankStack fields (counters, gpu_util, peer, subgroup, ...)."""
    frames = [Frame(function="main", file=JOB_FILE, line=line)]
    if op is not None:
        frames.insert(0, Frame(function=op, file=C10D, line=3000))
    return RankStack(
        rank=r,
        pid=100 + r,
        host="h",
        state=state,
        threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)] if stack else [],
        op=op,
        wait=wait or ("collective" if op else "other"),
        call_site=CallSite(file=JOB_FILE, line=line, function="main"),
        **fields,
    )


def ranks(n: int, op: str | None = None, **kwargs: Any) -> list[RankStack]:
    """Ranks 0..n-1, all alike."""
    return [rank(r, op, **kwargs) for r in range(n)]


def counters(stacks: list[RankStack], values: Mapping[int, int], name: str = "step") -> list[RankStack]:
    """The ranks with a progress counter ``name`` (``step`` decides alone; ``tokens`` only breaks ties)."""
    return [s.model_copy(update={"counters": {f"train.py:main:{name}": values[s.rank or 0]}}) for s in stacks]


def source(lines: Mapping[int, str]) -> dict[tuple[str, int], str]:
    """The lines of train.py a capture read, by number."""
    return {(JOB_FILE, n): text for n, text in lines.items()}


def facts_of(
    stacks: list[RankStack],
    *,
    backend: Backend | None = "gloo",
    world_size: int | None = None,
    hosts: Iterable[str] = (),
    master_addr: str | None = None,
    recorder: str | None = None,
    errors: Iterable[RankError] = (),
    missing: Iterable[int] = (),
    exited: Iterable[int] = (),
    flight: FlightReport | None = None,
    ras: RasFinding | None = None,
    lines: Mapping[tuple[str, int], str] | None = None,
) -> Facts:
    """The facts the rules read for these ranks, grouped as the analysis groups them."""
    job = Job(
        job_id="j",
        world_size=world_size if world_size is not None else len(stacks),
        hosts=list(hosts),
        master_addr=master_addr,
        backend=backend,
        recorder=recorder,
    )
    return with_evidence(
        sort_ranks(
            job,
            stacks,
            group_by_op(stacks),
            list(errors),
            sorted(missing),
            sorted(exited),
            backend=backend,
            flight=flight,
            ras=ras,
            source=lines,
        )
    )


__all__ = ["C10D", "JOB_FILE", "counters", "facts_of", "rank", "ranks", "source"]
