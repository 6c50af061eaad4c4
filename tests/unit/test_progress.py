"""The progress window's rules on hand-built looks: motion per rank, the job's motion, the straggler,
the verdicts of a job that is not hung, and the sampler's raw output."""

from __future__ import annotations

from rankscope.analysis.hang.progress import (
    RankWatch,
    counters_phrase,
    find_straggler,
    judge,
    merge_progress,
    parse_record,
    summarize,
    watch_rank,
)
from rankscope.analysis.hang.progress_verdict import progress_verdict
from rankscope.analysis.hang.stacks import analyze
from rankscope.models.core import Frame, Job, RankStack, ThreadStack
from rankscope.models.progress import RankMotion

T = "/job/train.py"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def own(line: int, function: str = "main") -> Frame:
    return Frame(function=function, file=T, line=line)


def all_reduce(line: int) -> list[Frame]:
    return [Frame(function="all_reduce", file=C10D, line=2800), own(line)]


def barrier(line: int) -> list[Frame]:
    return [Frame(function="barrier", file=C10D, line=4800), own(line)]


def watch(
    rank: int, *looks: list[Frame], counters: tuple[int, int] | None = None, cpu: float | None = 0.0
) -> RankWatch:
    steps = (
        [{"train.py:main:step": counters[0]}, {"train.py:main:step": counters[1]}] if counters else [{}, {}]
    )
    return RankWatch(rank=rank, looks=list(looks), counters=steps, cpu_s=cpu, wall_s=1.0)


def straggling(n: int, slow: int) -> list[RankWatch]:
    """``n`` moving ranks; ``slow`` spends 90% of its samples in load_batch, the others 96% in all_reduce."""
    watches = []
    for r in range(n):
        waiting = all_reduce(45)
        w = watch(r, waiting, waiting, counters=(7, 9))
        w.samples = [
            ([own(10, "load_batch"), own(40)], 45 if r == slow else 2),
            (waiting, 5 if r == slow else 48),
        ]
        watches.append(w)
    return watches


def stacks_at(frames: list[list[Frame]]) -> list[RankStack]:
    """Rank ``i`` with ``frames[i]`` as its main thread."""
    return [
        RankStack(rank=r, pid=10 + r, host="h", threads=[ThreadStack(thread_id=1, is_main=True, frames=f)])
        for r, f in enumerate(frames)
    ]


def test_parse_record_keeps_each_threads_stacks_innermost_first() -> None:
    text = (
        "thread (101): MainThread;<module> (/job/train.py:90);main (/job/train.py:40);load (/job/data.py:7) 12\n"
        "thread (101): MainThread;<module> (/job/train.py:90);main (/job/train.py:41) 3\n"
        "thread (205): pt_autograd_0;run (/usr/lib/python3.11/threading.py:982) 15\n"
        "thread (0x7F2E1C5D6740) 4\n"
        "a garbled line\n"
    )
    parsed = parse_record(text)
    assert set(parsed) == {101, 205, 0x7F2E1C5D6740}
    frames, count = parsed[101][0]
    assert count == 12 and [f.function for f in frames] == ["load", "main", "<module>"]
    assert frames[0].file == "/job/data.py" and frames[0].line == 7
    assert parsed[0x7F2E1C5D6740] == [([], 4)]


def test_a_rank_moves_when_its_counter_or_its_own_line_changes() -> None:
    by_counter = watch_rank(
        watch(0, all_reduce(30), all_reduce(30), counters=(5, 9)), backend="gloo", source={}
    )
    assert by_counter.motion == "moving" and by_counter.counters == {"train.py:main:step": [5, 9]}
    by_line = watch_rank(watch(0, all_reduce(30), [own(25)]), backend="gloo", source={})
    assert by_line.motion == "moving" and by_line.moved_lines == 2


def test_torch_frames_that_change_under_one_own_line_are_not_motion() -> None:
    """A wait that polls inside torch or the stdlib (the innermost frames churn) is still blocked."""
    churn = [Frame(function="_poll", file="/usr/lib/python3.11/threading.py", line=320), *all_reduce(30)]
    w = watch(1, all_reduce(30), churn)
    assert watch_rank(w, backend="gloo", source={}).motion == "blocked"


def test_cpu_in_its_own_code_is_busy_but_cpu_in_a_wait_is_not() -> None:
    """Same place twice: with CPU of its own it computes (a long call); on NCCL a CPU waiting for
    the GPU spins, and that is never motion."""
    compute = watch(0, [own(50, "evaluate")], [own(50, "evaluate")], cpu=0.9)
    assert watch_rank(compute, backend="gloo", source={}).motion == "busy"
    sync = [own(19)]
    spin = watch(1, sync, sync, cpu=1.0)
    source = {(T, 19): "        print(loss.item())"}
    assert watch_rank(spin, backend="nccl", source=source).motion == "blocked"
    idle = watch(2, [own(50, "evaluate")], [own(50, "evaluate")], cpu=0.01)
    assert watch_rank(idle, backend="gloo", source={}).motion == "blocked"


def test_one_step_apart_in_a_moving_job_is_progress_not_divergence() -> None:
    """The counters differ by a step between ranks (CPUs run ahead): the job moves; no hang rule runs."""
    watches = [
        watch(r, all_reduce(30), all_reduce(30), counters=(100 + (r == 3), 140 + (r == 3))) for r in range(4)
    ]
    progress = judge(watches, backend="nccl", source={}, window_s=1.0)
    assert progress.motion == "moving" and progress.straggler is None
    assert progress.summary.startswith("step 100-101 → 140-141 on every rank in 1.0 s")
    stacks = stacks_at([all_reduce(30)] * 4)
    report = analyze(Job(job_id="j", world_size=4, backend="nccl"), stacks, [], progress=progress)
    assert report.verdict.kind == "progressing" and report.verdict.suspect_ranks == []
    assert report.progress == progress


def _motion(rank: int, waiting: int, samples: int = 50, hot: list[str] | None = None) -> RankMotion:
    return RankMotion(rank=rank, motion="moving", samples=samples, waiting_pct=waiting, hot=hot or [])


def test_the_straggler_is_the_one_rank_the_others_wait_for() -> None:
    assert find_straggler([_motion(0, 90), _motion(1, 85), _motion(2, 10), _motion(3, 95)]) == 2
    assert find_straggler([_motion(0, 80), _motion(1, 5)]) == 1
    # everyone computes most of the time: no straggler, whatever the small differences
    assert find_straggler([_motion(0, 30), _motion(1, 35), _motion(2, 0)]) is None
    # two ranks wait little: no single straggler
    assert find_straggler([_motion(0, 90), _motion(1, 10), _motion(2, 12), _motion(3, 90)]) is None
    # too few samples say nothing
    assert find_straggler([_motion(0, 90, 2), _motion(1, 0, 2)]) is None


def test_a_rank_that_lags_only_while_queued_for_a_core_is_not_a_straggler() -> None:
    """On an oversubscribed host the rank the scheduler ran least waits least, though it does the same
    work: it queued for a core for most of its lag and used no more CPU than the others."""

    def m(rank: int, waiting: int, cpu: int | None, queued: int | None) -> RankMotion:
        return RankMotion(
            rank=rank, motion="moving", samples=50, waiting_pct=waiting, cpu_pct=cpu, queued_pct=queued
        )

    starved = [m(0, 66, 30, 25), m(1, 100, 32, 2)]
    assert find_straggler(starved) is None
    progress = summarize(starved, window_s=2.0, backend="gloo")
    assert progress.straggler is None
    assert "rank 0 waits less (66%) only because it queued for a core 25% of the window" in progress.summary
    # a rank that lags from its own work uses more CPU than the others, queued or not (a loaded host)
    assert find_straggler([m(0, 0, 35, 60), m(1, 95, 4, 1), m(2, 96, 5, 0)]) == 0
    # a few % of a core read a tick or two apart is the same work; five times the others' is not
    assert find_straggler([m(0, 55, 6, 60), m(1, 100, 3, 4)]) is None
    assert find_straggler([m(0, 9, 5, 93), m(1, 100, 0, 0)]) == 0
    # a lag the queue explains less than half of is the rank's own
    assert find_straggler([m(0, 40, 30, 10), m(1, 100, 30, 1)]) == 0
    # no run-queue or CPU reading (another kernel, an older capture): the rule stands as it was
    assert find_straggler([m(0, 66, 30, None), m(1, 100, 32, None)]) == 0
    assert find_straggler([m(0, 66, None, 25), m(1, 100, None, 2)]) == 0
    assert (
        "queued"
        not in summarize([m(0, 66, 30, None), m(1, 100, 32, None)], window_s=2.0, backend="gloo").summary
    )
    # a rank that stands still in its own code while it queued most of the window says so
    busy = summarize(
        [
            m(0, 0, 3, 95).model_copy(update={"motion": "busy"}),
            m(1, 100, 0, 0).model_copy(update={"motion": "blocked"}),
        ],
        window_s=1.2,
        backend="gloo",
    )
    assert "rank 0 is busy (CPU 3%, queued for a core 95%)" in busy.summary
    assert (
        "rank 0 is busy (CPU 3%, queued"
        not in summarize(
            [
                m(0, 0, 3, 10).model_copy(update={"motion": "busy"}),
                m(1, 100, 0, 0).model_copy(update={"motion": "blocked"}),
            ],
            window_s=1.2,
            backend="gloo",
        ).summary
    )
    # the verdict's first step is the host's cores, for a progressing job and a busy one alike
    verdict = progress_verdict(progress, [])
    assert verdict is not None and verdict.kind == "progressing" and verdict.suspect_ranks == []
    assert "queued for a core" not in verdict.next_steps[0].action  # 25% is not most of the window
    heavy = summarize([m(0, 40, 30, 70), m(1, 100, 32, 2)], window_s=2.0, backend="gloo")
    first = progress_verdict(heavy, [])
    assert first is not None and first.kind == "progressing", first
    assert first.next_steps[0].action.startswith(
        "rank 0 queued for a core 70% of the window: the host's cores"
    )
    assert not any(s.action.startswith("Nothing to fix") for s in first.next_steps)
    slow = progress_verdict(busy, [])
    assert slow is not None and slow.kind == "busy" and slow.suspect_ranks == [0], slow
    assert slow.next_steps[0].tool == "dump_stacks"  # busy: look again over a longer window first
    assert slow.next_steps[1].action.startswith("rank 0 queued for a core 95% of the window")
    # the share is of the window the rank was watched over (/proc/PID/schedstat's run delay)
    w = straggling(2, slow=0)[0]
    w.cpu_s, w.queued_s, w.wall_s = 0.6, 0.5, 2.0
    assert watch_rank(w, backend="gloo", source={}).queued_pct == 25


def test_straggler_verdict_names_its_hot_lines() -> None:
    watches = straggling(4, slow=2)
    progress = judge(watches, backend="gloo", source={}, window_s=1.0)
    assert progress.straggler == 2
    verdict = progress_verdict(progress, [])
    assert verdict is not None and verdict.kind == "straggler" and verdict.suspect_ranks == [2]
    assert "load_batch (train.py:10) 90%" in verdict.summary and "in collectives or for the GPU" not in (
        progress.summary
    )


def test_straggler_verdict_quotes_its_top_line_and_the_sizes_there() -> None:
    """The straggler's hot function's integer locals that stayed put (``side=448``) and its top line's
    text say why its work is larger; a moved counter and a ``_`` name are not sizes."""
    watches = straggling(4, slow=2)
    slow = watches[2]
    slow.counters = [
        {"train.py:main:step": 7, "train.py:load_batch:side": 448, "train.py:load_batch:_": 1},
        {"train.py:main:step": 9, "train.py:load_batch:side": 448, "train.py:load_batch:_": 3},
    ]
    source = {(T, 10): "    images = torch.rand(16, 1, side, side)"}
    progress = judge(watches, backend="gloo", source=source, window_s=1.0)
    motion = next(r for r in progress.ranks if r.rank == 2)
    assert motion.hot_locals == {"side": 448} and motion.hot_code == "images = torch.rand(16, 1, side, side)"
    verdict = progress_verdict(progress, [])
    assert verdict is not None
    assert "load_batch (train.py:10) 90% `images = torch.rand(16, 1, side, side)`" in verdict.summary
    assert verdict.summary.endswith("where side=448. Slow, not hung")
    # the summary holds its hot lines: its evidence line does not repeat them
    assert not any(e.startswith("rank 2:") and "own code" in e for e in verdict.evidence)
    # a look taken after the window gives sizes, never motion: the window's counters stand
    slow.counters = [{"train.py:main:step": 7}, {"train.py:main:step": 9}]
    slow.later = [{"train.py:main:step": 12, "train.py:load_batch:side": 448, "train.py:load_batch:_": 2}]
    later = next(r for r in judge(watches, backend="gloo", source={}, window_s=1.0).ranks if r.rank == 2)
    assert later.hot_locals == {"side": 448} and later.counters == {"train.py:main:step": [7, 9]}
    # a local of a function it does not spend its time in is not quoted
    slow.later = []
    slow.counters = [{"train.py:evaluate:side": 448}, {"train.py:evaluate:side": 448}]
    again = judge(watches, backend="gloo", source={}, window_s=1.0)
    assert next(r for r in again.ranks if r.rank == 2).hot_locals == {}


def _stack(rank: int, frames: list[Frame], op: str | None, wait: str) -> RankStack:
    return RankStack(
        rank=rank,
        pid=10 + rank,
        host="h",
        threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
        op=op,
        wait=wait,  # type: ignore[arg-type]
    )


def test_busy_rank_while_the_others_wait_is_busy_not_deadlock() -> None:
    watches = [watch(0, [own(50, "evaluate")], [own(51, "evaluate")], cpu=0.97)]
    watches += [watch(r, barrier(77), barrier(77), cpu=0.0) for r in (1, 2, 3)]
    progress = judge(watches, backend="gloo", source={}, window_s=1.2)
    assert progress.motion == "no_progress"
    annotated = [_stack(0, [own(50, "evaluate")], None, "other")]
    annotated += [_stack(r, barrier(77), "barrier", "collective") for r in (1, 2, 3)]
    verdict = progress_verdict(progress, annotated)
    assert verdict is not None and verdict.kind == "busy" and verdict.suspect_ranks == [0]
    assert verdict.next_steps[0].args == {"window_s": 12}


def test_a_blocked_rank_outside_any_wait_leaves_the_verdict_to_the_hang_rules() -> None:
    """Rank 0 busy, rank 3 blocked on a queue (no collective, no CPU): not 'busy', a hang rule decides."""
    watches = [watch(0, [own(50, "evaluate")], [own(51, "evaluate")], cpu=0.9)]
    watches += [watch(r, barrier(77), barrier(77)) for r in (1, 2)]
    watches += [watch(3, [own(60, "read_queue")], [own(60, "read_queue")])]
    progress = judge(watches, backend="gloo", source={}, window_s=1.0)
    annotated = [
        _stack(0, [own(50, "evaluate")], None, "other"),
        _stack(3, [own(60, "read_queue")], None, "other"),
    ]
    annotated += [_stack(r, barrier(77), "barrier", "collective") for r in (1, 2)]
    assert progress_verdict(progress, annotated) is None


def test_every_rank_computing_without_moving_lines_is_busy_without_a_suspect() -> None:
    watches = [watch(r, [own(12, "compile")], [own(12, "compile")], cpu=0.99) for r in range(2)]
    progress = judge(watches, backend="gloo", source={}, window_s=1.0)
    assert progress.motion == "busy"
    verdict = progress_verdict(progress, [_stack(r, [own(12, "compile")], None, "other") for r in range(2)])
    assert verdict is not None and verdict.kind == "busy" and verdict.suspect_ranks == []


def test_a_hang_keeps_its_rule_and_its_evidence_says_nothing_moved() -> None:
    watches = [watch(r, barrier(77), barrier(77)) for r in (0, 1)] + [
        watch(2, all_reduce(30), all_reduce(30))
    ]
    progress = judge(watches, backend="gloo", source={}, window_s=1.0)
    stacks = stacks_at([barrier(77), barrier(77), all_reduce(30)])
    report = analyze(Job(job_id="j", world_size=3, backend="gloo"), stacks, [], progress=progress)
    assert report.verdict.kind == "mismatched_collectives" and report.verdict.suspect_ranks == [2]
    assert report.verdict.evidence[0].startswith("window: nothing moved in 1.0 s on ranks 0-2")


def test_one_look_decides_nothing_about_motion() -> None:
    progress = judge([RankWatch(rank=0, looks=[[own(3)]])], backend="gloo", source={}, window_s=0.0)
    assert progress.motion == "unknown" and progress.ranks[0].motion == "unknown"
    assert progress_verdict(progress, []) is None and "not checked" in progress.summary


def test_counters_phrase_and_hosts_merged() -> None:
    ranks = [
        RankMotion(rank=0, motion="moving", counters={"t.py:main:step": [421, 547]}),
        RankMotion(
            rank=1, motion="moving", counters={"t.py:main:step": [421, 547], "t.py:main:tokens": [3, 9]}
        ),
    ]
    assert counters_phrase(ranks, 1.23) == "step 421 → 547 on every rank in 1.2 s"
    a = judge([watch(0, [own(1)], [own(2)])], backend="gloo", source={}, window_s=1.0)
    b = judge([watch(1, barrier(7), barrier(7))], backend="gloo", source={}, window_s=1.4)
    merged = merge_progress([a, b], "gloo")
    assert merged is not None and [r.rank for r in merged.ranks] == [0, 1]
    assert merged.motion == "no_progress" and merged.window_s == 1.4
    assert merge_progress([], "gloo") is None


def test_a_bounded_answer_keeps_the_progress_evidence_for_many_ranks() -> None:
    """64 moving ranks, one straggler: the bounded answer stays small, leads with the verdict and the
    window's evidence, and lists the straggler's motion; the others are summed up."""
    from rankscope.analysis.sizing.bound import bound_report
    from rankscope.analysis.sizing.fit import size_of
    from rankscope.models.compact import compact
    from rankscope.render.stacks import render_stacks_brief

    progress = judge(straggling(64, slow=17), backend="gloo", source={}, window_s=1.0)
    stacks = stacks_at([all_reduce(45)] * 64)
    report = analyze(Job(job_id="j", world_size=64, backend="gloo"), stacks, [], progress=progress)
    assert report.verdict.kind == "straggler" and report.verdict.suspect_ranks == [17]
    bounded = bound_report(report)
    assert size_of(compact(bounded)) <= 8_000
    assert bounded.progress is not None and [r.rank for r in bounded.progress.ranks] == [17]
    assert "progress.ranks is cut to the suspects" in (bounded.hint or "")
    text = "\n".join(render_stacks_brief(bounded))
    assert text.startswith("verdict: straggler") and "- window: step 7 → 9 on every rank" in text
    assert len(text) <= 4_000


def test_the_recorders_completed_collectives_are_a_counter_of_their_own() -> None:
    """Where the job opened a channel for a recorder dump, one at each end of the window: a rank
    whose completed sequence numbers grew moved, even when its stack and locals say nothing."""
    from rankscope.analysis.hang.progress import RECORDER_KEY, recorder_completed, with_recorder
    from rankscope.models.core import Verdict
    from rankscope.models.flight import FlightReport, FrProcessGroup, FrRankProgress

    def flight(done: dict[int, int]) -> FlightReport:
        group = FrProcessGroup(
            name="0",
            progress=[FrRankProgress(rank=r, process_group="0", last_completed=n) for r, n in done.items()],
        )
        return FlightReport(process_groups=[group], verdict=Verdict(kind="inconclusive", summary="-"))

    assert recorder_completed(flight({0: 120, 1: 120})) == {0: 120, 1: 120}
    assert recorder_completed(None) == {}
    sync = [own(19)]
    watches = [watch(r, sync, sync, cpu=1.0) for r in (0, 1)]
    with_recorder(watches, flight({0: 120, 1: 120}), flight({0: 180, 1: 180}))
    assert watches[0].counters[-1][RECORDER_KEY] == 180
    progress = judge(watches, backend="nccl", source={(T, 19): "    loss.item()"}, window_s=1.0)
    assert progress.motion == "moving" and "completed_seq 120 → 180 on every rank" in progress.summary
