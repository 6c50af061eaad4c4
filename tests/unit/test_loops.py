"""The loop one rank has left and the others are still in (uneven inputs), read from source lines,
and the verdict and fix it gives on real captured stacks."""

from __future__ import annotations

from rankscope.analysis.hang.loops import Loop, enclosing_loops, loop_left
from rankscope.analysis.hang.stacks import analyze
from rankscope.models.core import Frame, Job, RankStack, ThreadStack
from tests.paths import ROOT
from tests.unit.test_stacks_analysis import load as load_capture

TRAIN = "/job/train.py"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def src(text: str) -> dict[tuple[str, int], str]:
    return {(TRAIN, i): line for i, line in enumerate(text.splitlines(), 1)}


def frame(function: str, line: int, file: str = TRAIN) -> Frame:
    return Frame(function=function, file=file, line=line)


# an epoch loop calling a function with a loop over the loader, then an evaluation barrier
EPOCHS = """\
def train_epoch(loader):
    for step, (x, y) in enumerate(loader):  # one batch per step
        loss = model(x)

        # the gradient all-reduce
        loss.backward()


def main():
    for epoch in range(10):
        train_epoch(loader)
        dist.barrier()
"""

# one function: the loop over batches, then a barrier after it
FLAT = """\
def main():
    while True:
        batch = next(it, None)
        if batch is None:
            break
        dist.all_reduce(batch)
    dist.barrier()
"""

# rank 0 saves a checkpoint at some steps; the others go on to the next step's gradients
CHECKPOINT = """\
def train():
    for step in range(100):
        for p in params:
            dist.all_reduce(p.grad)
        if step % 40 == 0:
            save_checkpoint()
"""


def test_loops_around_a_line_innermost_first_to_the_def() -> None:
    loops = enclosing_loops(frame("train_epoch", 6), src(EPOCHS))
    assert [(lp.line, lp.header) for lp in loops] == [(2, "for step, (x, y) in enumerate(loader)")]
    assert loops[0].counter == "step" and loops[0].counter_key == "train.py:train_epoch:step"
    assert [lp.line for lp in enclosing_loops(frame("main", 11), src(EPOCHS))] == [10]
    assert enclosing_loops(frame("main", 12), src(FLAT)) == []  # no code line 12
    assert enclosing_loops(frame("main", 7), src(FLAT)) == []  # after the loop
    assert enclosing_loops(frame("main", 6), src(FLAT))[0].counter is None  # a while has none


def test_a_line_not_read_finds_no_loop() -> None:
    partial = {k: v for k, v in src(EPOCHS).items() if k[1] != 4}
    assert enclosing_loops(frame("train_epoch", 6), partial) == []  # the walk stops at a hole


def test_counter_of_parenthesised_and_plain_targets() -> None:
    def loop(text: str) -> Loop:
        return Loop(TRAIN, "main", 1, text)

    assert loop("for (i, batch) in enumerate(dl):").counter == "i"
    assert loop("async for item in stream:  # x").header == "for item in stream"
    assert loop("for epoch in range(3):").counter == "epoch"
    assert loop("for x in xs:  # comment").header == "for x in xs"


def test_the_rank_past_the_call_left_the_callees_loop() -> None:
    others = [frame("backward", 100, C10D), frame("train_epoch", 6), frame("main", 11)]
    suspect = [frame("barrier", 200, C10D), frame("main", 12)]
    left = loop_left(suspect, others, src(EPOCHS))
    assert left is not None and not left.suspect_inside
    assert (left.loop.function, left.loop.line) == ("train_epoch", 2)


def test_the_rank_after_the_loop_in_the_same_function_left_it() -> None:
    left = loop_left([frame("barrier", 200, C10D), frame("main", 7)], [frame("main", 6)], src(FLAT))
    assert left is not None and left.loop.line == 2 and not left.suspect_inside
    # the other way round: the suspect is the one still in the loop (it has more batches)
    left = loop_left([frame("main", 6)], [frame("barrier", 200, C10D), frame("main", 7)], src(FLAT))
    assert left is not None and left.suspect_inside


def test_ranks_in_different_iterations_of_a_shared_loop_left_nothing() -> None:
    suspect = [frame("barrier", 200, C10D), frame("save_checkpoint", 50), frame("train", 6)]
    others = [frame("all_reduce", 300, C10D), frame("train", 4)]
    source = src(CHECKPOINT)
    left = loop_left(suspect, others, source)
    assert left is not None and left.loop.line == 3  # without counters the inner loop is all it sees
    behind = ({"train.py:train:step": 40}, {"train.py:train:step": 41})
    assert loop_left(suspect, others, source, behind) is None
    same = ({"train.py:train:step": 41}, {"train.py:train:step": 41})
    assert loop_left(suspect, others, source, same) is not None


def test_ranks_on_the_same_line_or_without_source_left_nothing() -> None:
    at = [frame("main", 6)]
    assert loop_left(at, at, src(FLAT)) is None
    assert loop_left([frame("main", 7)], at, {}) is None


def test_real_fsdp2_stacks_skip_the_last_step_and_name_the_loop() -> None:
    """Captured gloo stacks (tests/programs/hang_fsdp2.py): rank 1 `continue`s its last step and
    waits in the barrier after the loop; ranks 0,2 wait in that step's all-gather."""
    job, stacks, _ = load_capture("fsdp2_skip_forward")
    program = ROOT / "tests" / "programs" / "hang_fsdp2.py"
    where = next(
        f.file for s in stacks for t in s.threads for f in t.frames if f.file.endswith("hang_fsdp2.py")
    )
    lines = program.read_text().splitlines()
    source = {(where, i): text for i, text in enumerate(lines, 1)}
    v = analyze(job, stacks, [], source=source).verdict
    assert v.kind == "mismatched_collectives" and v.suspect_ranks == [1]
    assert "rank 1 has left the loop at hang_fsdp2.py:29 `for step in range(a.steps)`" in v.summary
    # the loop's body holds the way out that only rank 1 took
    exit_ = (
        "`last and rank == a.odd` (hang_fsdp2.py:33) sends some ranks to the `continue` at hang_fsdp2.py:34"
    )
    assert exit_ in v.summary
    fix = v.next_steps[0].action
    assert fix.startswith("Fix: take the `continue` at hang_fsdp2.py:34 on every rank or on none")
    assert "(the branch at hang_fsdp2.py:33)" in fix


def main_stack(rank: int, frames: list[Frame], counters: dict[str, int] | None = None) -> RankStack:
    thread = ThreadStack(thread_id=1, is_main=True, frames=frames)
    return RankStack(rank=rank, pid=10 + rank, host="h", threads=[thread], counters=counters or {})


def test_a_data_condition_breaking_out_of_the_loop_is_the_fix() -> None:
    stacks = [
        main_stack(0, [frame("barrier", 200, C10D), frame("main", 7)]),
        *(main_stack(r, [frame("all_reduce", 300, C10D), frame("main", 6)]) for r in (1, 2, 3)),
    ]
    job = Job(job_id="j", launcher="torchrun", world_size=4, backend="gloo")
    v = analyze(job, stacks, [], source=src(FLAT)).verdict
    assert v.suspect_ranks == [0]
    assert "rank 0 has left the loop at train.py:2 `while True` that ranks 1-3 are still in" in v.summary
    assert "`batch is None` (train.py:4) sends some ranks to the `break` at train.py:5" in v.summary
    fix = v.next_steps[0].action
    assert fix.startswith(
        "Fix: all_reduce the flag first, so every rank takes the `break` at train.py:5 alike"
    )
    assert "(the branch at train.py:4)" in fix


# each rank decides alone to stop early: the break stands below the line the others wait on
EARLY_STOP = """\
def main():
    for step in range(1, 10**6):
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            val_loss = validate(model, val)
            for p in model.parameters():
                if p.grad is None:
                    break
            if val_loss < TARGET:
                break
    dist.barrier()
"""


def test_a_break_below_the_others_line_taken_in_an_earlier_iteration_is_named() -> None:
    """Rank 3 took the early-stop ``break`` at the end of step 200's body alone and waits in the
    barrier after the loop; the others went round to step 201's backward, above that break. The
    break of the nested loop is not the way out."""
    stacks = [
        main_stack(3, [frame("barrier", 200, C10D), frame("main", 13)], {"train.py:main:step": 200}),
        *(
            main_stack(r, [frame("backward", 100, C10D), frame("main", 4)], {"train.py:main:step": 201})
            for r in (0, 1, 2)
        ),
    ]
    job = Job(job_id="j", launcher="torchrun", world_size=4, backend="gloo")
    v = analyze(job, stacks, [], source=src(EARLY_STOP)).verdict
    assert v.suspect_ranks == [3]
    assert "`val_loss < TARGET` (train.py:11) sends some ranks to the `break` at train.py:12" in v.summary
    assert v.next_steps[0].action.startswith(
        "Fix: all_reduce the flag first, so every rank takes the `break` at train.py:12 alike"
    )


def test_without_a_way_out_in_the_body_the_fix_is_equal_batches() -> None:
    """The uneven-inputs shape of a DDP job: the others in their loop over the loader at step 31,
    the suspect past the call in the epoch loop, in the evaluation barrier."""
    inside = [frame("backward", 100, C10D), frame("train_epoch", 6), frame("main", 11)]
    counted = {"train.py:train_epoch:step": 31, "train.py:main:epoch": 0}
    stacks = [
        main_stack(0, inside, counted),
        main_stack(1, inside, counted),
        main_stack(2, [frame("barrier", 200, C10D), frame("main", 12)], {"train.py:main:epoch": 0}),
    ]
    job = Job(job_id="j", launcher="torchrun", world_size=3, backend="gloo")
    v = analyze(job, stacks, [], source=src(EPOCHS)).verdict
    assert v.suspect_ranks == [2]
    loop = "rank 2 has left the loop at train.py:2 `for step, (x, y) in enumerate(loader)`"
    assert f"{loop} that ranks 0-1 are still in (at step=31)" in v.summary
    assert "fewer batches than the others (uneven inputs)" in v.summary
    fix = v.next_steps[0].action
    assert fix.startswith("Fix: give every rank the same number of batches for the loop at train.py:2")
    assert "DistributedSampler(drop_last=True)" in fix and "join()" in fix


def test_a_guard_above_the_collective_is_the_story_not_the_loop() -> None:
    """Rank 0's barrier under `if rank == 0` after the gradient loop: the condition is the cause,
    the inner loop it finished is not."""
    code = """\
def train():
    for step in range(100):
        for p in params:
            dist.all_reduce(p.grad)
        if rank == 0 and step % 40 == 0:
            dist.barrier()
"""

    def stack(rank: int, op: str, line: int) -> RankStack:
        frames = [frame(op, 3000, C10D), frame("train", line)]
        return RankStack(
            rank=rank,
            pid=10 + rank,
            host="h",
            threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
        )

    stacks = [stack(0, "barrier", 6), *(stack(r, "all_reduce", 4) for r in (1, 2, 3))]
    job = Job(job_id="j", launcher="torchrun", world_size=4, backend="gloo")
    v = analyze(job, stacks, [], source=src(code)).verdict
    assert v.suspect_ranks == [0] and "left the loop" not in v.summary
    assert v.next_steps[0].action.startswith("Fix: every rank must reach the barrier")


def test_two_ranks_split_evenly_are_decided_by_the_loop_one_left() -> None:
    """Captured gloo stacks of a 2-rank DDP job (tests/programs/hang_ddp.py): rank 1 skips its last
    backward under `if last and rank == a.odd: continue` and waits in the barrier after the loop.
    No majority names anyone; the loop rank 1 left does, at medium confidence."""
    for case in ("ddp_skip_backward", "ddp_skip_backward_locals"):
        job, stacks, _ = load_capture(case)
        where = next(
            f.file for s in stacks for t in s.threads for f in t.frames if f.file.endswith("hang_ddp.py")
        )
        lines = (ROOT / "tests" / "programs" / "hang_ddp.py").read_text().splitlines()
        v = analyze(job, stacks, [], source={(where, i): text for i, text in enumerate(lines, 1)}).verdict
        assert (v.kind, v.suspect_ranks, v.confidence) == ("mismatched_collectives", [1], "medium"), case
        assert "the ranks split evenly, but rank 1 has left the loop at hang_ddp.py:25" in v.summary
        assert "sends some ranks to the `continue` at hang_ddp.py:31" in v.summary
        assert v.next_steps[0].action.startswith(
            "Fix: take the `continue` at hang_ddp.py:31 on every rank or on none"
        )
        # without the source no loop is read, and the even split names no one
        assert analyze(job, stacks, []).verdict.confidence == "low"


def test_a_rank_with_more_batches_is_still_in_the_loop_the_others_left() -> None:
    inside = [frame("backward", 100, C10D), frame("train_epoch", 6), frame("main", 11)]
    past = [frame("barrier", 200, C10D), frame("main", 12)]
    stacks = [
        main_stack(0, past),
        main_stack(1, past),
        main_stack(2, inside, {"train.py:train_epoch:step": 32, "train.py:main:epoch": 0}),
    ]
    job = Job(job_id="j", launcher="torchrun", world_size=3, backend="gloo")
    v = analyze(job, stacks, [], source=src(EPOCHS)).verdict
    assert v.suspect_ranks == [2]
    loop = "rank 2 is still in the loop at train.py:2 `for step, (x, y) in enumerate(loader)` that ranks 0-1 have left"
    assert f"{loop} (at step=32): it runs more iterations than they do" in v.summary
    assert v.next_steps[0].action.startswith(
        "Fix: give every rank the same number of batches for the loop at train.py:2"
    )


# a data-dependent skip above the all_reduce, then a barrier every 10 steps, in one loop body
SKIP = """\
def main():
    for step in range(100):
        x = model(batch)
        if torch.isnan(x).any():
            continue
        dist.all_reduce(x)
        if step % 10 == 0:
            dist.barrier()
"""


def _in_main(rank: int, op: str, line: int, step: int) -> RankStack:
    frames = [frame(op, 3000, C10D), frame("main", line)]
    return RankStack(
        rank=rank,
        pid=10 + rank,
        host="h",
        threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
        counters={"train.py:main:step": step},
    )


def test_a_skip_inside_the_same_loop_body_is_named() -> None:
    """Rank 1 took the `continue` once: it waits at the barrier (line 8) of the same iteration in which
    the others wait in the all_reduce (line 6). The guarded continue above their line is named."""
    source = src(SKIP)
    left = loop_left([frame("main", 8)], [frame("main", 6)], source)
    assert left is not None and left.same_body and left.loop.line == 2 and not left.suspect_inside
    assert left.exit is not None and left.exit.line == 5 and left.exit.guard is not None
    assert left.exit.guard.condition == "torch.isnan(x).any()"
    # the others ahead of the suspect: not this story; no guarded exit above: nothing to name
    assert loop_left([frame("main", 6)], [frame("main", 8)], source) is None
    assert (
        loop_left(
            [frame("main", 8)],
            [frame("main", 6)],
            src(SKIP.replace("            continue\n", "            pass\n")),
        )
        is None
    )

    stacks = [_in_main(r, "barrier" if r == 1 else "all_reduce", 8 if r == 1 else 6, 10) for r in range(4)]
    v = analyze(Job(job_id="j", world_size=4, backend="gloo"), stacks, [], source=source).verdict
    assert v.kind == "mismatched_collectives" and v.suspect_ranks == [1], v
    assert (
        "rank 1 is at a later collective of the same body of the loop at train.py:2 `for step in range(100)` than "
        "ranks 0,2-3 (at step=10): rank 1 issued fewer collectives earlier in that body; `torch.isnan(x).any()` "
        "(train.py:4) sends some ranks to the `continue` at train.py:5"
    ) in v.summary, v.summary
    assert v.next_steps[0].action.startswith(
        "Fix: all_reduce the flag first, so every rank takes the `continue`"
    )


def test_a_skip_inside_the_same_loop_body_on_a_real_capture() -> None:
    """tests/programs/hang_skip_body.py on 4 gloo ranks: rank 1 took the `continue` at step 5."""
    job, stacks, raw = load_capture("skip_in_body")
    source = {(k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1])): t for k, t in raw["sources"].items()}
    v = analyze(job, stacks, [], source=source).verdict
    assert v.suspect_ranks == [1] and v.confidence == "high", v
    assert "rank 1 issued fewer collectives earlier in that body; `torch.isnan(x).any()`" in v.summary, (
        v.summary
    )
    assert v.next_steps[0].action.startswith(
        "Fix: all_reduce the flag first, so every rank takes the `continue`"
    )
