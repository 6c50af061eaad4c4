"""The condition above a collective's call site, read from the source lines the shell supplies."""

from __future__ import annotations

from rankscope.analysis.hang.conditions import guard_of
from rankscope.models.core import CallSite, Frame, RankStack, ThreadStack

TRAIN = "/job/train.py"


def src(text: str) -> dict[tuple[str, int], str]:
    return {(TRAIN, i): line for i, line in enumerate(text.splitlines(), 1)}


def site(line: int) -> CallSite:
    return CallSite(file=TRAIN, line=line, function="main")


CODE = """\
def main():
    for step in range(10):
        loss = model(x)
        if dist.get_rank() == 0:
            dist.barrier()
        if torch.isfinite(loss):
            loss.backward()
            dist.all_reduce(grad)
        if step % 10 == 0:
            dist.all_reduce(metric)
        else:
            if is_main_process():
                pass
            else:
                dist.broadcast(t, 0)
        dist.all_reduce(t)
"""


EXTRA_BARRIER = """\
def main():
    for step in range(3):
        if rank == 1:
            dist.barrier()
        dist.all_reduce(t)
"""


def c10d_stack(rank: int, op: str, line: int) -> RankStack:
    """A rank waiting in a c10d ``op`` called from ``main`` at ``line`` of train.py."""
    frames = [
        Frame(
            function=op,
            file="/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
            line=3000,
        ),
        Frame(function="main", file=TRAIN, line=line),
    ]
    return RankStack(
        rank=rank, pid=10 + rank, host="h", threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)]
    )


def test_rank_condition_is_quoted() -> None:
    g = guard_of(site(5), src(CODE))
    assert g is not None and g.kind == "rank" and g.line == 4 and g.text == "if dist.get_rank() == 0:"
    assert (
        g.phrase("train.py", "barrier", 5)
        == "train.py:4 `if dist.get_rank() == 0:` guards the barrier at train.py:5"
    )


def test_data_condition_is_found_through_other_statements() -> None:
    g = guard_of(site(8), src(CODE))
    assert g is not None and g.kind == "data" and g.line == 6


def test_else_branch_is_followed_to_its_if() -> None:
    g = guard_of(site(15), src(CODE))
    assert g is not None and g.kind == "rank" and g.line == 12


def test_no_guard_for_a_plain_call_or_an_unrelated_condition() -> None:
    assert guard_of(site(16), src(CODE)) is None  # only the for loop encloses it
    assert guard_of(site(10), src(CODE)) is None  # step % 10 says nothing about ranks or data
    assert guard_of(site(5), {}) is None  # source not readable
    assert guard_of(None, src(CODE)) is None


def test_even_split_decided_by_a_rank_condition_and_left_open_without_source() -> None:
    from rankscope.analysis.hang.stacks import analyze
    from rankscope.models.core import Job

    stacks = [c10d_stack(0, "all_reduce", 5), c10d_stack(1, "barrier", 4)]
    job = Job(job_id="j", world_size=2, backend="gloo")
    v = analyze(job, stacks, [], source=src(EXTRA_BARRIER)).verdict
    assert v.kind == "mismatched_collectives" and v.suspect_ranks == [1] and v.confidence == "medium"
    assert "train.py:3 `if rank == 1:` guards the barrier at train.py:4" in v.summary
    open_split = analyze(job, stacks, []).verdict
    assert open_split.suspect_ranks == [0, 1] and open_split.confidence == "low"


def test_divergence_frame_in_library_code_is_named() -> None:
    """A Trainer in site-packages: both groups' user call site is the same `trainer.fit()` line."""
    from rankscope.analysis.hang.stacks import analyze
    from rankscope.models.core import Frame, Job, RankStack, ThreadStack

    sp = "/venv/lib/python3.11/site-packages/"
    c10d = sp + "torch/distributed/distributed_c10d.py"
    fit_line = {"barrier": 68, "all_reduce": 67}

    def stack(rank: int, op: str) -> RankStack:
        inner = (
            [Frame(function="Checkpoint.on_fit_end", file=sp + "mylib/callbacks.py", line=46)]
            if op == "barrier"
            else [Frame(function="Trainer._average_gradients", file=sp + "mylib/trainer.py", line=38)]
        )
        frames = [
            Frame(function=op, file=c10d, line=3000),
            *inner,
            Frame(function="Trainer.fit", file=sp + "mylib/trainer.py", line=fit_line[op]),
            Frame(function="main", file=TRAIN, line=29),
        ]
        return RankStack(
            rank=rank,
            pid=10 + rank,
            host="h",
            threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
        )

    stacks = [stack(0, "all_reduce"), stack(1, "barrier"), stack(2, "all_reduce")]
    v = analyze(Job(job_id="j", world_size=3, backend="gloo"), stacks, []).verdict
    assert v.suspect_ranks == [1]
    assert (
        "rank 1 leaves ranks 0,2 in Trainer.fit (mylib/trainer.py): at line 68, they at line 67" in v.summary
    )
    assert "later in the same function" in v.summary


def test_repro_choice_tells_an_extra_collective_under_a_rank_condition_the_right_way_round() -> None:
    from rankscope.analysis.hang.stacks import analyze
    from rankscope.analysis.templates import choose_from_stacks
    from rankscope.models.core import Job

    report = analyze(
        Job(job_id="j", world_size=2, backend="gloo"),
        [c10d_stack(0, "all_reduce", 5), c10d_stack(1, "barrier", 4)],
        [],
        source=src(EXTRA_BARRIER),
    )
    choice = choose_from_stacks(report)
    # an extra barrier on one rank is not a skipped all_reduce: the template that does what the job did
    assert choice.template == "extra_collective"
    assert choice.params["extra_rank"] == 1 and choice.params["extra_op"] == "barrier"
    assert choice.params["next_op"] == "all_reduce"
    assert any("entered an extra barrier under a rank condition" in r for r in choice.reasons)
    assert not any("skipped the all_reduce" in r for r in choice.reasons)


def test_a_guard_every_rank_passes_through_explains_nothing() -> None:
    """``if "RANK" in os.environ: main()`` is on every rank's stack: it cannot be why they split."""
    from rankscope.analysis.hang.stacks import analyze
    from rankscope.models.core import Job

    source = "\n".join(
        ["def main():", "    for step in range(3):", "        sync()", "    dist.barrier()", "", "",
         'if "RANK" in os.environ:', "    main()"]
    )  # fmt: skip

    def stack(rank: int, op: str, line: int) -> RankStack:
        frames = [
            Frame(
                function=op,
                file="/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                line=3000,
            ),
            Frame(function="main", file=TRAIN, line=line),
            Frame(function="<module>", file=TRAIN, line=8),
        ]
        return RankStack(
            rank=rank,
            pid=10 + rank,
            host="h",
            threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
        )

    report = analyze(
        Job(job_id="j", world_size=2, backend="gloo"), [stack(0, "all_reduce", 3), stack(1, "barrier", 4)], [],
        source=src(source),
    )  # fmt: skip
    assert "guards" not in report.verdict.summary and not any("guards" in e for e in report.verdict.evidence)


def test_repro_choice_for_a_rank_past_the_loop_is_the_data_dependent_skip() -> None:
    from rankscope.analysis.hang.stacks import analyze
    from rankscope.analysis.templates import choose_from_stacks
    from rankscope.models.core import Job

    def stack(rank: int, op: str, line: int) -> RankStack:
        frames = [
            Frame(
                function=op,
                file="/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                line=3000,
            ),
            Frame(function="train", file=TRAIN, line=line),
        ]
        return RankStack(
            rank=rank,
            pid=10 + rank,
            host="h",
            threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
        )

    stacks = [stack(0, "all_reduce", 67), stack(1, "barrier", 70), stack(2, "all_reduce", 67)]
    report = analyze(Job(job_id="j", world_size=3, backend="gloo"), stacks, [])
    choice = choose_from_stacks(report)
    assert choice.template == "nonfinite_skip" and choice.params["bad_rank"] == 1
    assert any("one all_reduce less earlier" in r for r in choice.reasons)


CHECKPOINT = """\
def save_checkpoint(model):
    dist.barrier()

def train():
    for step in range(100):
        dist.all_reduce(grad)
        if rank == 0 and step % 50 == 0:
            save_checkpoint(model)
"""


def test_a_rank_condition_leaves_no_guess_of_a_skipped_batch() -> None:
    """Rank 0 in a checkpoint barrier below ``if rank == 0``, past the others' all_reduce in the same
    function: the condition is the story. The parting's guess for a rank past the others' line (a
    skipped batch, an early continue) would send the reader after a bug that is not there."""
    from rankscope.analysis.hang.stacks import analyze
    from rankscope.models.core import Job

    def stack(rank: int) -> RankStack:
        c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
        inner = (
            [
                Frame(function="barrier", file=c10d, line=5356),
                Frame(function="save_checkpoint", file=TRAIN, line=2),
            ]
            if rank == 0
            else [Frame(function="all_reduce", file=c10d, line=3252)]
        )
        frames = [*inner, Frame(function="train", file=TRAIN, line=8 if rank == 0 else 6)]
        return RankStack(
            rank=rank,
            pid=10 + rank,
            host="h",
            threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
        )

    job = Job(job_id="j", world_size=4, backend="gloo")
    v = analyze(job, [stack(r) for r in range(4)], [], source=src(CHECKPOINT)).verdict
    assert v.kind == "mismatched_collectives" and v.suspect_ranks == [0]
    assert "`if rank == 0 and step % 50 == 0:` guards the barrier" in v.summary
    said = " ".join([v.summary, *v.evidence])
    assert "skipped batch" not in said and "fewer collectives" not in said


PIPELINE = """\
def main():
    for step in range(3):
        if rank == 0:
            schedule.step(inputs)
        else:
            schedule.step()
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
"""


def test_a_call_made_in_both_branches_is_not_guarded_by_their_condition() -> None:
    """A pipeline's first stage feeds the input, the others do not: every rank calls
    ``schedule.step``, so ``rank == 0`` picks arguments and guards nothing. A different call in the
    other branch (a send for a recv) leaves the condition a guard."""
    assert guard_of(site(6), src(PIPELINE)) is None
    g = guard_of(site(10), src(PIPELINE))
    assert g is not None and g.kind == "rank" and g.line == 7
