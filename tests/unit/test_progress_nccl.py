"""Hung, slow or fine on real NCCL jobs: the progress window replayed from a real GPU's captures.

tests/data/progress_nccl/README.md says how each was made and what is true of it. Each window
holds, per rank, what rankscope's window reads: a py-spy dump with locals at both ends, py-spy's
sampler in between (raw), /proc CPU time at both ends. ``sampled/`` holds six dumps per rank
0.4 s apart (no sampler), from an earlier capture of the same kind of jobs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankscope.analysis.hang.counters import int_locals
from rankscope.analysis.hang.progress import RankWatch, judge, parse_record
from rankscope.analysis.hang.stacks import analyze
from rankscope.models.core import Frame, Job, RankStack, ThreadStack
from rankscope.models.progress import Progress
from rankscope.runtime.pyspy import parse_dump

DATA = Path(__file__).resolve().parents[1] / "data" / "progress_nccl"
TICKS = 100  # CLK_TCK of the machine the captures come from


def _source(*scripts: str) -> dict[tuple[str, int], str]:
    """The scripts' lines under the path they ran at (/workspace/<script>)."""
    out: dict[tuple[str, int], str] = {}
    for script in scripts:
        for n, line in enumerate((DATA / script).read_text().splitlines(), 1):
            out[(f"/workspace/{Path(script).name}", n)] = line
    return out


SOURCE = _source("jobs.py", "sampled/h1_healthy.py", "sampled/s4_straggler.py")


def _main(threads: list[ThreadStack]) -> list[Frame]:
    return next(t.frames for t in threads if t.is_main)


def _cpu(path: Path) -> float:
    utime, stime = path.read_text().split()[:2]
    return (int(utime) + int(stime)) / TICKS


def _window(mode: str) -> tuple[list[RankWatch], list[RankStack]]:
    """The watches and the first looks (as RankStacks) of one captured job."""
    w = DATA / mode / "window"
    wall = float((w / "t1.txt").read_text()) - float((w / "t0.txt").read_text())
    watches: list[RankWatch] = []
    stacks: list[RankStack] = []
    for env in sorted(w.glob("env_*.txt")):
        pid = int(env.stem.split("_")[1])
        rank = int(dict(kv.split("=") for kv in env.read_text().split())["RANK"])
        looks = [parse_dump(json.loads((w / f"look{i}_{pid}.json").read_text()), pid) for i in (0, 1)]
        samples = parse_record((w / f"record_{pid}.txt").read_text()).get(pid, [])
        watches.append(
            RankWatch(
                rank=rank,
                looks=[_main(t) for t in looks],
                counters=[int_locals(_main(t)) for t in looks],
                samples=samples,
                cpu_s=_cpu(w / f"stat1_{pid}.txt") - _cpu(w / f"stat0_{pid}.txt"),
                wall_s=wall,
            )
        )
        stacks.append(
            RankStack(rank=rank, pid=pid, host="h", state="running", threads=looks[0], backend="nccl")
        )
    return watches, stacks


def _judged(mode: str) -> tuple[Progress, list[RankStack]]:
    watches, stacks = _window(mode)
    wall = watches[0].wall_s
    return judge(watches, backend="nccl", source=SOURCE, window_s=wall), stacks


def _verdict(mode: str) -> tuple[str, list[int], str, str]:
    progress, stacks = _judged(mode)
    report = analyze(
        Job(job_id="j", world_size=4, backend="nccl"), stacks, [], source=SOURCE, progress=progress
    )
    v = report.verdict
    return v.kind, v.suspect_ranks, v.confidence, v.summary


def test_a_healthy_nccl_job_is_progressing() -> None:
    """Every CPU waits for the GPU at a copy to it, all the time; only ``step`` moves."""
    progress, _ = _judged("healthy")
    assert progress.motion == "moving" and progress.straggler is None
    assert "step" in progress.summary and "on every rank" in progress.summary
    kind, suspects, confidence, _ = _verdict("healthy")
    assert (kind, suspects, confidence) == ("progressing", [], "high")


def test_an_nccl_straggler_is_named_with_where_its_time_goes() -> None:
    """Rank 2 decodes 1024 px images (CPU) while ranks 0, 1, 3 wait at ``.cuda()`` for the GPU."""
    progress, _ = _judged("straggler")
    assert progress.motion == "moving" and progress.straggler == 2
    rank2 = next(r for r in progress.ranks if r.rank == 2)
    assert rank2.hot and "load_batch" in rank2.hot[0]
    kind, suspects, _, summary = _verdict("straggler")
    assert (kind, suspects) == ("straggler", [2])
    assert "load_batch" in summary and "not hung" in summary


@pytest.mark.parametrize("mode", ["busy", "gpueval"])
def test_a_long_evaluation_on_one_rank_is_busy_not_a_deadlock(mode: str) -> None:
    """Rank 0 evaluates (on the CPU, or on the GPU with .item() per batch) while ranks 1-3 wait in
    barrier(): nothing completes, yet nobody is stuck. On NCCL the waiting ranks' CPUs spin, so
    their CPU time is not taken for motion."""
    progress, _ = _judged(mode)
    assert progress.motion == "no_progress"
    assert {r.rank for r in progress.ranks if r.motion == "blocked"} == {1, 2, 3}
    kind, suspects, confidence, summary = _verdict(mode)
    assert (kind, suspects, confidence) == ("busy", [0], "medium")
    assert "barrier" in summary and "evaluate" in summary and "deadlock" in summary


def test_a_rank_alone_in_an_object_collective_is_named_on_nccl() -> None:
    """Rank 0 calls all_gather_object in an evaluation branch the others skip; they ran on into the
    next step and wait for the GPU. Nothing moves; rank 0 issued a collective the others did not."""
    progress, _ = _judged("lone")
    assert progress.motion == "no_progress"
    kind, suspects, _, summary = _verdict("lone")
    assert (kind, suspects) == ("mismatched_collectives", [0])
    assert "all_gather_object" in summary and "nothing moved" not in summary


def test_same_barrier_line_on_nccl_is_not_the_same_collective() -> None:
    """Rank 1 skipped a step (4 all_reduces fewer); every CPU then stands in the final barrier().
    The stacks cannot tell; the verdict says so and points at the collective state."""
    kind, suspects, confidence, summary = _verdict("skipstep")
    assert (kind, suspects, confidence) == ("inconclusive", [], "low")
    assert "barrier" in summary and "cannot tell" in summary


def _sampled(mode: str) -> Progress:
    """Six dumps per rank, 0.4 s apart, taken as the looks (no sampler)."""
    d = DATA / "sampled" / mode
    pids = {int(r): int(p) for r, p in (line.split() for line in (d / "ranks.txt").read_text().splitlines())}
    times = [line.split() for line in (d / "sample_times.txt").read_text().splitlines()]
    wall = float(times[-1][1]) - float(times[0][1])
    watches = []
    for rank, pid in pids.items():
        looks = [
            _main(parse_dump(json.loads((d / f"sample{i}_rank{rank}.json").read_text()), pid))
            for i in range(1, 7)
        ]
        watches.append(
            RankWatch(
                rank=rank,
                looks=looks,
                counters=[int_locals(looks[0]), int_locals(looks[-1])],
                cpu_s=_cpu(d / f"stat6_rank{rank}.txt") - _cpu(d / f"stat1_rank{rank}.txt"),
                wall_s=wall,
            )
        )
    return judge(watches, backend="nccl", source=SOURCE, window_s=wall)


def test_six_looks_of_an_nccl_job_decide_too() -> None:
    """Without the sampler (six dumps only) the healthy job moves and the straggler is still found."""
    healthy = _sampled("healthy")
    assert healthy.motion == "moving" and healthy.straggler is None
    straggler = _sampled("straggler")
    assert straggler.motion == "moving" and straggler.straggler == 2
