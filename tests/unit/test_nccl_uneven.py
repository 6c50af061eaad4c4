"""A real NCCL hang of an 8-rank DDP job (tests/data/nccl_uneven, an H200, torch 2.11, NCCL 2.28.9):
rank 5's shard is one batch short, so it leaves the epoch loop and waits in evaluate()'s barrier
while the others' last backward all-reduce waits for it; their CPUs stop at the next GPU wait
(``float(loss)``). Live, the stacks name rank 5 and tell the story; dead, the recorder does."""

from __future__ import annotations

import json

from rankscope.analysis.hang.stacks import analyze
from rankscope.capabilities.triage import triage_logs
from rankscope.models.core import RankStack, StacksReport
from tests.paths import DATA

CAPTURE = DATA / "nccl_uneven"
SOURCE_FILE = "/tmp/uneven/train.py"  # where the job ran; its copy is in the capture


def live() -> StacksReport:
    saved = StacksReport.model_validate(json.loads((CAPTURE / "stacks_full.json").read_text()))
    stacks = [
        RankStack(rank=s.rank, pid=s.pid, host=s.host, state=s.state, threads=s.threads, counters=s.counters)
        for s in saved.stacks
    ]
    lines = (CAPTURE / "train.py").read_text().splitlines()
    source = {(SOURCE_FILE, i): text for i, text in enumerate(lines, 1)}
    return analyze(saved.job, stacks, [], source=source)


def test_live_names_the_short_rank_and_says_it_ran_out_early() -> None:
    v = live().verdict
    assert v.kind == "mismatched_collectives" and v.suspect_ranks == [5]
    assert "rank 5 is inside barrier at train.py:84" in v.summary
    assert "wait for the GPU at train.py:107" in v.summary
    # the others are still in train_epoch's loop over the loader (main:126), rank 5 past it (main:127)
    loop = "rank 5 has left the loop at train.py:101 `for step, (x, y) in enumerate(loader)`"
    assert loop in v.summary and "ranks 0-4,6-7 are still in (at step=31)" in v.summary
    assert "uneven inputs" in v.summary and "fewer collectives" in v.summary


def test_live_the_first_step_is_the_fix_for_uneven_inputs() -> None:
    first = live().verdict.next_steps[0].action
    assert first.startswith("Fix: give every rank the same number of batches for the loop at train.py:101")
    assert "join()" in first


def test_dead_the_recorder_names_the_short_rank_and_counts_the_missing_all_reduce() -> None:
    report = triage_logs([str(CAPTURE / "torchrun.log"), str(CAPTURE / "fr")])
    assert report.suspect_ranks == [5] and report.decided_by == "flight_recorder"
    assert "rank 5 recorded 1 fewer nccl:all_reduce" in report.summary
    assert set(report.victim_ranks) == {0, 1, 2, 3, 4, 6, 7}
