"""Slow or stuck, decided over time, on real 3-rank gloo jobs (tests/programs/slow_or_stuck.py):
the odd rank always stands against a majority of two.

One job writes a checkpoint slowly on rank 0 (low CPU, chunks, fsyncs, short sleeps) while ranks 1-2
wait in a barrier: call after call, never a hang kind. One job spins forever on rank 1 polling for a
file that never appears while ranks 0 and 2 wait in all_reduce: the window the first answer asks for
concludes it is stuck, naming the loop and the path. The jobs are reaped by the ``jobs`` fixture,
pass or fail.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import get_args

import pytest

from rankscope.analysis.hang.progress_verdict import PROGRESS_KINDS
from rankscope.api import dump_stacks
from rankscope.models.core import VerdictKind
from rankscope.options import DumpOptions
from tests.jobs import JobFactory

pytestmark = pytest.mark.slow

READY_S = 180.0
HANG_KINDS = set(get_args(VerdictKind)) - set(PROGRESS_KINDS)
CALLS = 10
CALLS_BUDGET_S = 75.0
"""Ten calls in a row, or as many as fit here on a loaded host (three at least)."""


def test_a_slow_checkpoint_write_is_never_called_hung(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path
) -> None:
    job = jobs.torchrun(
        "slow_or_stuck.py",
        nproc=3,
        args=["--mode", "ckpt", "--odd", "0", "--every", "5", "--ckpt-s", "3", "--dir", str(tmp_path)],
    )
    job.wait_ready(timeout=READY_S)
    start, seen = time.monotonic(), []
    while len(seen) < CALLS and (len(seen) < 3 or time.monotonic() - start < CALLS_BUDGET_S):
        verdict = dump_stacks(job.pid).verdict
        seen.append(verdict)
        assert verdict.kind not in HANG_KINDS, verdict.summary
        assert verdict.suspect_ranks in ([0], []), verdict.summary
        if verdict.suspect_ranks:
            assert "writing" in verdict.summary or "save_checkpoint" in verdict.summary, verdict.summary
    assert any("writing" in v.summary for v in seen), [v.summary for v in seen]
    assert job.proc.poll() is None


@pytest.mark.parametrize("mode", ["poll", "sleeppoll"])
def test_a_rank_polling_forever_is_concluded_stuck_over_the_window_asked_for(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path, mode: str
) -> None:
    job = jobs.torchrun(
        "slow_or_stuck.py", nproc=3, args=["--mode", mode, "--odd", "1", "--dir", str(tmp_path)]
    )
    job.wait_ready(timeout=READY_S)
    first = dump_stacks(job.pid).verdict
    if first.kind == "busy":  # a spin at 100% CPU: look again over the window it asks for
        step = first.next_steps[0]
        assert step.tool == "dump_stacks" and step.args is not None
        window = float(str(step.args["window_s"]))
    else:  # asleep in the loop at low CPU: the hang rules already name it; the long window says why
        assert first.kind == "divergent_ranks" and first.suspect_ranks == [1], first.summary
        window = 12.0
    verdict = dump_stacks(job.pid, DumpOptions(window=window)).verdict
    assert verdict.kind in HANG_KINDS and verdict.suspect_ranks == [1], verdict.summary
    assert verdict.confidence in ("medium", "high")
    assert "slow_or_stuck.py:" in verdict.summary and "`while not os.path.exists(p)`" in verdict.summary
    assert str(tmp_path / "never-created") in verdict.summary
    line = next(e for e in verdict.evidence if e.startswith("rank 1:"))
    assert "moved" in line
