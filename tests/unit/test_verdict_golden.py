"""The hang verdict of every capture the tests hold, kept word for word (tests/data/verdicts.json).

A change to the verdict's rules or words shows up here as a diff of the golden file: a
refactoring must leave it unchanged, a deliberate change rewrites it
(``RANKSCOPE_REGOLD=1 pytest tests/unit/test_verdict_golden.py``) and the diff is reviewed.
Each capture is read under several backends and with a rank missing, a stopped rank, a
recorder or RAS answer beside it, so most rules and their tie-breaks meet a real stack.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, get_args

from rankscope.analysis.hang.ras import finding
from rankscope.analysis.hang.stacks import analyze
from rankscope.analysis.recorder.flight import analyze as analyze_flight
from rankscope.analysis.startup import startup_verdict
from rankscope.capabilities.recorder.flight import read_dumps
from rankscope.models.core import Job, RankProcess, RankStack, StacksReport, VerdictKind
from rankscope.models.flight import FlightReport
from rankscope.models.ras import RasFinding
from tests.golden import check_golden
from tests.paths import DATA
from tests.unit import test_nccl_uneven, test_progress_nccl, test_startup
from tests.unit.test_ras import PIDS
from tests.unit.test_ras import load as load_ras
from tests.unit.test_stacks_analysis import load as load_capture
from tests.unit.test_waits_counters_backend import gpu_waiting_ranks

GOLDEN = DATA / "verdicts.json"
STACKS = DATA / "stacks"
BACKENDS: tuple[str | None, ...] = ("as saved", None, "gloo", "nccl")

Source = dict[tuple[str, int], str]


def _captures() -> list[str]:
    """Every saved capture of stacks/ and stacks/nccl/, by the name its loader takes."""
    return [str(p.relative_to(STACKS).with_suffix("")) for p in sorted(STACKS.glob("*.json"))] + [
        str(p.relative_to(STACKS).with_suffix("")) for p in sorted((STACKS / "nccl").glob("*.json"))
    ]


def _load(case: str, backend: str | None) -> tuple[Job, list[RankStack], Source]:
    job, stacks, raw = load_capture(case)
    if backend != "as saved":
        job = job.model_copy(
            update={
                "backend": backend,
                "ranks": [r.model_copy(update={"backend": backend}) for r in job.ranks],
            }
        )
    text: dict[str, str] = raw.get("source") or raw.get("sources") or {}
    source = {(k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1])): v for k, v in text.items()}
    return job, stacks, source


def _variants(job: Job, stacks: list[RankStack]) -> Iterator[tuple[str, Job, list[RankStack]]]:
    """The capture changed the ways the rules tell apart: one rank more in the world than it
    holds (seen from one host, from two, on a loopback MASTER_ADDR), its last rank stopped, every
    rank stopped, no stack at all, a clear and a weak progress counter that names the last rank,
    and the last rank's GPU idle while the others spin."""
    world = (job.world_size or len(stacks)) + 1
    yield "+missing", job.model_copy(update={"world_size": world}), stacks
    yield "+missing@2hosts", job.model_copy(update={"world_size": world, "hosts": ["h1", "h2"]}), stacks
    yield (
        "+missing@loopback",
        job.model_copy(update={"world_size": world, "master_addr": "127.0.0.1"}),
        stacks,
    )
    last = max(s.rank for s in stacks if s.rank is not None)

    def each(update: dict[str, Any], odd: dict[str, Any] | None = None) -> list[RankStack]:
        """Every rank with ``update``, the last one with ``odd`` when given."""
        return [s.model_copy(update=odd if odd is not None and s.rank == last else update) for s in stacks]

    yield "+stopped", job, each({}, {"state": "stopped"})
    yield "+all_stopped", job, each({"state": "stopped"})
    yield "+nothing", job, each({"threads": []})
    for name, key in (("+counters", "train.py:main:step"), ("+weak_counters", "train.py:main:tokens")):
        yield name, job, each({"counters": {key: 10}}, {"counters": {key: 3}})
    yield "+gpu_idle", job, each({"gpu_util": 100}, {"gpu_util": 0})


def _flights() -> dict[str, FlightReport]:
    out = {}
    for path in sorted((DATA / "flight").iterdir()):
        if path.is_dir() and path.name != "__pycache__":  # the folder's build script may leave one
            dumps, errors = read_dumps([str(path)])
            out[path.name] = analyze_flight(dumps, errors)
    return out


def _ras() -> dict[str, tuple[RasFinding, int]]:
    """RAS answers, each with the world size of its job."""
    two = {
        "behind": ("status_rank5_behind.json", "status_rank5_behind_again.json", 8),
        "straggling": ("status_rank5_behind.json", "status_rank5_straggling.json", 8),
        "dead": ("status_rank2_dead.json", "status_rank2_dead.json", 8),
        "agree": ("status_all_launched.json", "status_all_launched.json", 4),
        "text_mismatch": ("status_text_mismatch.txt", "status_text_mismatch.txt", 8),
    }
    return {
        name: (finding(load_ras(a), load_ras(b), pid_rank=PIDS, world_size=n, interval_s=3), n)
        for name, (a, b, n) in two.items()
    }


def _gpu_waiting_job(n: int) -> tuple[Job, list[RankStack]]:
    """``n`` NCCL ranks all waiting for the GPU at one line, with the pids RAS reports for them."""
    job = Job(
        job_id="j",
        world_size=n,
        backend="nccl",
        ranks=[RankProcess(rank=r, pid=41000 + r, host="h") for r in range(n)],
    )
    return job, gpu_waiting_ranks(n, lambda r: {"pid": 41000 + r})


def _cases() -> Iterator[tuple[str, Callable[[], StacksReport]]]:
    for case in _captures():
        for backend in BACKENDS:
            job, stacks, source = _load(case, backend)
            yield f"{case}@{backend}", partial(analyze, job, stacks, [], source=source)
            if backend not in ("as saved", None):
                continue
            for suffix, j, s in _variants(job, stacks):
                if backend is None and suffix not in ("+stopped", "+weak_counters"):
                    continue
                yield f"{case}@{backend}{suffix}", partial(analyze, j, s, [], source=source)
    flights = _flights()
    for case in (
        "nccl/all_item_native_locals",
        "nccl/barrier_eval",
        "nccl/extra_barrier",
        "mismatch_barrier",
    ):
        for backend in ("as saved", "gloo"):
            job, stacks, source = _load(case, backend)
            for name, flight in flights.items():
                yield (
                    f"{case}@{backend}+flight:{name}",
                    partial(analyze, job, stacks, [], flight, source=source),
                )
    for name, (ras, n) in _ras().items():
        job, stacks = _gpu_waiting_job(n)
        yield f"gpu_waiting_{n}+ras:{name}", partial(analyze, job, stacks, [], ras=ras)
        gloo = job.model_copy(update={"backend": "gloo"})
        yield f"gpu_waiting_{n}@gloo+ras:{name}", partial(analyze, gloo, stacks, [], ras=ras)
    yield "nccl_uneven", test_nccl_uneven.live
    for name in test_startup.CASES:
        yield f"startup/{name}", partial(_startup_case, name)
    for mode in ("busy", "gpueval", "healthy", "lone", "skipstep", "straggler"):
        yield f"progress_nccl/{mode}", partial(_progress_case, mode, watched=True)
        yield f"progress_nccl/{mode}@stacks_only", partial(_progress_case, mode, watched=False)


def _startup_case(name: str) -> StacksReport:
    """A job that never started (tests/unit/test_startup.py's facts), judged by the start-up verdict."""
    job, facts, stacks = test_startup.CASES[name]()
    ruled = startup_verdict(job, facts, stacks, remote=True)
    assert ruled is not None, name
    return StacksReport(verdict=ruled[0], job=job)


def _progress_case(mode: str, *, watched: bool) -> StacksReport:
    progress, stacks = test_progress_nccl._judged(mode)
    job = Job(job_id="j", world_size=4, backend="nccl")
    return analyze(job, stacks, [], source=test_progress_nccl.SOURCE, progress=progress if watched else None)


def _verdicts() -> dict[str, Any]:
    return {name: build().verdict.model_dump(mode="json") for name, build in _cases()}


def test_every_verdict_is_as_recorded() -> None:
    got = _verdicts()
    check_golden(GOLDEN, got, "verdicts")


def test_the_golden_file_covers_every_verdict_kind() -> None:
    """A golden file that lost its variety would let a rule change unnoticed."""
    kinds = {v["kind"] for v in json.loads(GOLDEN.read_text()).values()}
    assert kinds == set(get_args(VerdictKind))  # every kind a verdict can have, the hung-or-slow ones too
