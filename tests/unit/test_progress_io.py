"""Slow or stuck, decided over time, on hand-built windows: I/O, kernel waits and locals as signs of
motion; a window long enough concludes a rank stuck in a loop; what moved is said for each rank named.

The moments are those a `rankscope stacks` call can catch in the two live jobs of
tests/programs/slow_or_stuck.py: rank 0 writing a checkpoint slowly (in a write, in the sleep between
chunks, in an fsync, at the checkpoint's end, in training) while the others wait in a barrier; rank 1
spinning on a marker file while the others wait in all_reduce.
"""

from __future__ import annotations

from typing import get_args

from rankscope.analysis.hang.progress import RankWatch, judge, place_lines, watch_rank
from rankscope.analysis.hang.progress_signals import (
    io_bytes,
    io_phrase,
    io_progress,
    kernel_kind,
    kernel_shares,
    locals_moved,
    own_reprs,
)
from rankscope.analysis.hang.progress_stuck import condition_values, stuck_loop
from rankscope.analysis.hang.progress_verdict import PROGRESS_KINDS, progress_verdict
from rankscope.models.core import Frame, LocalVar, RankStack, ThreadStack, Verdict, VerdictKind

T = "/job/train.py"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
GENERICPATH = "/usr/lib/python3.11/genericpath.py"
HANG_KINDS = set(get_args(VerdictKind)) - set(PROGRESS_KINDS)
MiB = 1 << 20

SOURCE_LINES = {
    30: "def save_checkpoint(path, seconds):",
    31: "    with open(path, 'wb') as f:",
    32: "        while time.monotonic() < end:",
    33: "            f.write(os.urandom(CHUNK))",
    34: "            os.fsync(f.fileno())",
    35: "            time.sleep(0.02)",
    40: "def wait_for_marker(p):",
    41: "    while not os.path.exists(p):",
    42: "        pass",
    43: "    return p",
    50: "def wait_until_ready(flag_path, tries):",
    51: "    while True:",
    52: "        if os.path.exists(flag_path):",
    53: "            break",
    54: "        spin_once()",
    60: "def ready(p):",
    61: "    return os.path.isfile(p) and os.path.getsize(p) > 0",
    70: "def main():",
    71: "    for step in range(10**9):",
    72: "        train_step(model, x)",
    73: "        if rank == 1:",
    74: "            wait_for_marker(marker)",
    75: "        while not ready(marker):",
    76: "            pass",
    77: "        dist.barrier()",
    80: "def evaluate():",
    81: "    big = torch.linalg.svd(matrix)",
}
SOURCE = {(T, n): text for n, text in SOURCE_LINES.items()}


def own(line: int, function: str = "main", **locals_: str) -> Frame:
    values = [LocalVar(name=k, repr=v) for k, v in locals_.items()] or None
    return Frame(function=function, file=T, line=line, locals=values)


def in_main(*inner: Frame, line: int = 74) -> list[Frame]:
    return [*inner, own(line)]


def collective(op: str, line: int) -> list[Frame]:
    return [Frame(function=op, file=C10D, line=2800), own(line)]


def exists_call(line: int, function: str, **locals_: str) -> list[Frame]:
    return in_main(Frame(function="exists", file=GENERICPATH, line=19), own(line, function, **locals_))


def waiter(rank: int, op: str = "barrier", line: int = 77, wall: float = 1.2) -> RankWatch:
    frames = collective(op, line)
    return RankWatch(
        rank=rank, looks=[frames, frames], counters=[{}, {}], samples=[(frames, 50)], cpu_s=0.01, wall_s=wall
    )


def stacks_of(watches: list[RankWatch]) -> list[RankStack]:
    """The first looks as the stacks the analysis annotated: a rank in c10d waits in a collective."""
    out = []
    for w in watches:
        frames = w.looks[0]
        op = frames[0].function if frames[0].file == C10D else None
        out.append(
            RankStack(
                rank=w.rank,
                pid=10 + w.rank,
                host="h",
                threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
                op=op,
                wait="collective" if op else "other",
            )
        )
    return out


def verdict_of(watches: list[RankWatch], window_s: float) -> Verdict:
    progress = judge(watches, backend="gloo", source=SOURCE, window_s=window_s)
    verdict = progress_verdict(progress, stacks_of(watches))
    assert verdict is not None, progress.summary
    return verdict


# --- the signals -------------------------------------------------------------------------------


def test_kernel_waits_are_read_by_kind() -> None:
    assert kernel_kind("S", "hrtimer_nanosleep") == "timer"
    assert kernel_kind("D", "folio_wait_bit") == "file"
    assert kernel_kind("D", "jbd2_log_wait_commit") == "file"
    assert kernel_kind("D", "") == "file"  # uninterruptible, the name hidden: disk, most likely
    assert kernel_kind("S", "futex_wait_queue") == "futex"
    assert kernel_kind("S", "sk_wait_data") == "socket"
    assert kernel_kind("S", "ep_poll") == "poll"
    assert kernel_kind("S", "pipe_read") == "pipe"
    assert kernel_kind("R", "") == "running"
    assert kernel_kind("S", "task_work_run") == "other"
    assert kernel_shares([("S", "hrtimer_nanosleep")] * 3 + [("R", "")]) == {"timer": 75, "running": 25}


def test_io_counts_when_bytes_move_in_calls_larger_than_a_poll() -> None:
    checkpoint = {"wchar": 5 * MiB, "syscw": 20}
    assert io_bytes(checkpoint) == (0, 5 * MiB) and io_progress(checkpoint, {})
    assert io_phrase(checkpoint, {}, 1.25) == "writing: 5.0 MiB in 1.2 s, 4.0 MiB/s"
    # a loop that prints a line per turn moves many characters in tiny calls: not progress
    printing = {"wchar": 400_000, "syscw": 20_000}
    assert not io_progress(printing, {})
    # bytes that reached storage count whatever the calls
    assert io_progress({"write_bytes": 128 * 1024, "wchar": 100, "syscw": 1000}, {})
    # no byte moved, but most of the window waiting on a file (an fsync to a slow disk)
    assert io_progress({}, {"file": 80, "running": 20})
    assert io_phrase({}, {"file": 80}, 1.0) == "in a file read or write 80% of the window"
    assert not io_progress({"rchar": 4096, "syscr": 2}, {"timer": 100})


def test_locals_moved_compares_the_first_and_last_look() -> None:
    first = own_reprs([own(33, "save_checkpoint", written="262144", path="'/ckpt/0.pt'"), own(74)])
    last = own_reprs([own(35, "save_checkpoint", written="5242880", path="'/ckpt/0.pt'"), own(74)])
    assert locals_moved([first, last]) == ["written"]
    assert locals_moved([first]) == [] and locals_moved([first, first]) == []
    # torch's and the standard library's frames are not the job's
    assert (
        own_reprs(
            [Frame(function="exists", file=GENERICPATH, line=19, locals=[LocalVar(name="p", repr="1")])]
        )
        == {}
    )


# --- a slow checkpoint write: never a hang ------------------------------------------------------


def writer(
    *,
    wrote: int = 5 * MiB,
    places: tuple[int, ...] = (33, 35),
    kernel: list[tuple[str, str]] | None = None,
    cpu: float = 0.02,
    wall: float = 1.2,
    counters: tuple[int, int] | None = None,
) -> RankWatch:
    """Rank 0 in save_checkpoint: writing chunks and sleeping between them, at low CPU."""
    looks = [in_main(own(places[0], "save_checkpoint")), in_main(own(places[-1], "save_checkpoint"))]
    steps = (
        [{"train.py:main:step": counters[0]}, {"train.py:main:step": counters[1]}] if counters else [{}, {}]
    )
    return RankWatch(
        rank=0,
        looks=looks,
        counters=steps,
        samples=[(in_main(own(p, "save_checkpoint")), 10) for p in places],
        cpu_s=cpu * wall,
        wall_s=wall,
        io=[
            {"wchar": 1000, "syscw": 10},
            {"wchar": 1000 + wrote, "syscw": 10 + max(1, wrote // (256 * 1024))},
        ],
        kernel=kernel if kernel is not None else [("S", "hrtimer_nanosleep")] * 9 + [("D", "folio_wait_bit")],
    )


def test_a_rank_writing_while_the_others_wait_is_a_straggler_named_with_its_write() -> None:
    verdict = verdict_of([writer(), *(waiter(r) for r in (1, 2, 3))], 1.2)
    assert verdict.kind == "straggler" and verdict.suspect_ranks == [0]
    assert "writing: 5.0 MiB in 1.2 s" in verdict.summary and "save_checkpoint" in verdict.summary
    assert "ranks 1-3 wait in barrier" in verdict.summary and "not hung" in verdict.summary
    line = next(e for e in verdict.evidence if e.startswith("rank 0:"))
    assert "moved: io (writing: 5.0 MiB" in line and "lines (2 places)" in line
    assert "sleeping in a timer 90%" in line


def test_every_moment_of_a_slow_checkpoint_is_slow_not_hung() -> None:
    """The moments ten calls in a row can catch: never a hang kind, rank 0 or no one named, the
    write as the reason whenever rank 0 is named."""
    moments = {
        "in writes and sleeps": [writer(), *(waiter(r) for r in (1, 2, 3))],
        "one chunk only, the rest asleep": [writer(wrote=256 * 1024), *(waiter(r) for r in (1, 2, 3))],
        "in an fsync all window": [
            writer(wrote=0, places=(34,), kernel=[("D", "folio_wait_bit")] * 8 + [("R", "")] * 2),
            *(waiter(r) for r in (1, 2, 3)),
        ],
        "a long window of writing": [
            writer(wall=12.0, wrote=60 * MiB),
            *(waiter(r, wall=12.0) for r in (1, 2, 3)),
        ],
    }
    for name, watches in moments.items():
        wall = watches[0].wall_s
        verdict = verdict_of(watches, wall)
        assert verdict.kind not in HANG_KINDS, (name, verdict.summary)
        assert verdict.suspect_ranks in ([0], []), name
        if verdict.suspect_ranks:
            assert "writing" in verdict.summary or "file read or write" in verdict.summary, (
                name,
                verdict.summary,
            )


def test_a_window_across_the_checkpoints_end_names_the_write() -> None:
    """Rank 0 finished writing and every rank stepped on: the job moves, held back by the writer."""
    w0 = writer(counters=(40, 41))
    w0.samples = [(in_main(own(33, "save_checkpoint")), 40), (collective("barrier", 77), 5)]
    others = []
    for r in (1, 2, 3):
        w = waiter(r)
        w.counters = [{"train.py:main:step": 40}, {"train.py:main:step": 41}]
        others.append(w)
    verdict = verdict_of([w0, *others], 1.2)
    assert verdict.kind == "straggler" and verdict.suspect_ranks == [0]
    assert "it is writing: 5.0 MiB" in verdict.summary


def test_a_rank_moving_its_lines_at_low_cpu_is_not_called_hung_from_a_short_window() -> None:
    """Lines alone moved (no byte, no counter): slow or stuck cannot be told from 1.2 s; look longer."""
    w0 = writer(wrote=0, kernel=[("S", "hrtimer_nanosleep")] * 10)
    verdict = verdict_of([w0, *(waiter(r) for r in (1, 2, 3))], 1.2)
    assert verdict.kind == "busy" and verdict.suspect_ranks == [0]
    assert "cannot be told yet" in verdict.summary
    assert verdict.next_steps[0].args == {"window_s": 12}


# --- a rank spinning forever: the window the answer asks for concludes ---------------------------


def spinner(
    wall: float,
    *,
    frames: list[Frame] | None = None,
    reprs: tuple[dict[str, str], dict[str, str]] | None = None,
    counters: tuple[int, int] | None = None,
    io: dict[str, int] | None = None,
) -> RankWatch:
    """Rank 1 in ``while not os.path.exists(p): pass`` at 100% CPU."""
    spin = frames or exists_call(41, "wait_for_marker", p="'/tmp/run/never-created'")
    held = own_reprs(spin)
    steps = (
        [{"train.py:main:step": counters[0]}, {"train.py:main:step": counters[1]}] if counters else [{}, {}]
    )
    return RankWatch(
        rank=1,
        looks=[spin, spin],
        counters=steps,
        samples=[(spin, int(50 * wall))],
        cpu_s=wall,
        wall_s=wall,
        io=[{"rchar": 0, "syscr": 0}, io or {"rchar": 0, "syscr": 0}],
        kernel=[("R", "")] * 20,
        reprs=list(reprs) if reprs else [held, held],
    )


def spin_job(wall: float, **kw: object) -> list[RankWatch]:
    return [spinner(wall, **kw), *(waiter(r, "all_reduce", 72, wall) for r in (0, 2, 3))]  # type: ignore[arg-type]


def test_a_short_window_on_a_spinning_rank_asks_for_the_window_that_concludes() -> None:
    verdict = verdict_of(spin_job(1.2), 1.2)
    assert verdict.kind == "busy" and verdict.suspect_ranks == [1] and verdict.confidence == "medium"
    assert "cannot be told yet" in verdict.summary
    assert verdict.next_steps[0].args == {"window_s": 12}


def test_the_window_the_answer_asked_for_concludes_stuck_with_the_loop_and_its_value() -> None:
    for wall in (10.0, 12.3, 120.0):
        verdict = verdict_of(spin_job(wall), wall)
        assert verdict.kind == "divergent_ranks" and verdict.suspect_ranks == [1], verdict.summary
        assert verdict.confidence == "high"
        assert "train.py:41 `while not os.path.exists(p)`" in verdict.summary
        assert "p='/tmp/run/never-created'" in verdict.summary
        assert "ranks 0,2-3 wait in all_reduce" in verdict.summary
        line = next(e for e in verdict.evidence if e.startswith("rank 1:"))
        assert "nothing moved (counters, I/O, lines, locals)" in line
        step = verdict.next_steps[1]
        assert step.tool == "dump_stacks" and step.args is not None and step.args["full_ranks"] == [1]


def test_a_long_window_where_something_moved_is_slow_not_stuck() -> None:
    """A counter, a local or bytes moved over the long window: it gets somewhere, never a hang."""
    moved_local = ({"train.py:wait_for_marker:total": "1.5"}, {"train.py:wait_for_marker:total": "9.5"})
    for kw in ({"counters": (3, 900)}, {"reprs": moved_local}, {"io": {"rchar": 8 * MiB, "syscr": 40}}):
        verdict = verdict_of(spin_job(12.0, **kw), 12.0)
        assert verdict.kind not in HANG_KINDS and "cannot be told" not in verdict.summary, (
            kw,
            verdict.summary,
        )
        assert verdict.suspect_ranks == [1]


def test_a_spin_that_prints_is_still_stuck() -> None:
    """A polling loop that logs a line per turn moves characters, in calls too small to be progress."""
    verdict = verdict_of(spin_job(12.0, io={"wchar": 300_000, "syscw": 10_000}), 12.0)
    assert verdict.kind == "divergent_ranks" and verdict.suspect_ranks == [1]


def test_the_condition_is_read_from_a_break_in_the_loops_body_and_from_callers() -> None:
    # ``while True:`` with ``if os.path.exists(flag_path): break`` in its body
    body = in_main(
        Frame(function="exists", file=GENERICPATH, line=19),
        own(52, "wait_until_ready", flag_path="'/data/ready.flag'", tries="3", self="<Poller at 0x7f00>"),
    )
    w = spinner(12.0, frames=body)
    w.samples.append((in_main(own(54, "wait_until_ready")), 40))  # spin_once() turns the loop
    verdict = verdict_of([w, *(waiter(r, "all_reduce", 72, 12.0) for r in (0, 2, 3))], 12.0)
    assert verdict.kind == "divergent_ranks" and "train.py:51 `while True`" in verdict.summary
    assert "flag_path='/data/ready.flag'" in verdict.summary and "tries" not in verdict.summary
    # the loop is in the caller: ``while not ready(marker):`` spins through a helper of the job's own
    helper = [own(61, "ready", p="'/m'"), own(75, marker="'/data/marker'")]
    verdict = verdict_of(spin_job(12.0, frames=helper), 12.0)
    assert "train.py:75 `while not ready(marker)`" in verdict.summary
    assert "marker='/data/marker'" in verdict.summary


def test_one_line_with_nothing_moving_and_no_loop_is_stuck_with_medium_confidence() -> None:
    svd = in_main(
        Frame(function="svd", file="/venv/lib/python3.11/site-packages/torch/linalg.py", line=9),
        own(81, "evaluate"),
        line=72,
    )
    verdict = verdict_of(spin_job(12.0, frames=svd), 12.0)
    assert verdict.kind == "divergent_ranks" and verdict.confidence == "medium"
    assert "longer than the window" in verdict.summary


def test_stuck_loop_needs_every_look_inside_the_loop() -> None:
    inside = exists_call(41, "wait_for_marker", p="'/x'")
    outside = in_main(own(43, "wait_for_marker"))
    reprs = own_reprs(inside)
    assert stuck_loop([inside, inside], inside, reprs, SOURCE) is not None
    assert stuck_loop([inside, outside], inside, reprs, SOURCE) is None
    assert stuck_loop([inside], inside, reprs, {}) is None  # no source: no loop read
    assert condition_values(["not os.path.exists(p)", "n > 'x'"], {"p": "'/a'", "os": "<module>"}) == {
        "p": "'/a'"
    }


def test_place_lines_read_the_loops_around_the_last_look() -> None:
    lines = place_lines([spinner(1.0)])
    assert (T, 41) in lines and (T, 41 + 20) in lines and (T, 1) in lines


# --- NCCL: a CPU that spins for the GPU is not moved by I/O ------------------------------------


def test_io_never_moves_a_rank_that_waits_for_the_gpu() -> None:
    """On NCCL a rank in ``loss.item()`` spins at 100% CPU; bytes its main thread moved (a log, a
    store read) do not make it move, and a long window does not call it stuck in a loop."""
    source = {**SOURCE, (T, 19): "        print(loss.item())"}
    spin = [Frame(function="main", file=T, line=19)]
    w = RankWatch(
        rank=0,
        looks=[spin, spin],
        counters=[{}, {}],
        samples=[(spin, 600)],
        cpu_s=12.0,
        wall_s=12.0,
        io=[{"wchar": 0, "syscw": 0}, {"wchar": 50 * MiB, "syscw": 50}],
        kernel=[("R", "")] * 20,
        reprs=[{"train.py:main:x": "1.0"}, {"train.py:main:x": "2.0"}],
    )
    motion = watch_rank(w, backend="nccl", source=source)
    assert motion.motion == "blocked" and motion.moved == [] and motion.loop is None


NCCL_MODES = ("healthy", "straggler", "busy", "gpueval", "lone", "skipstep")


def _nccl_verdict(mode: str, *, io: bool, window_s: float | None = None) -> tuple[str, list[int]]:
    """A real NCCL capture's verdict; ``io``: every rank that waits for the GPU or a collective most of
    the window is given 50 MiB written by its main thread and a file wait in the kernel."""
    from rankscope.analysis.hang.stacks import analyze
    from rankscope.models.core import Job
    from tests.unit.test_progress_nccl import SOURCE as NCCL_SOURCE
    from tests.unit.test_progress_nccl import _window

    watches, stacks = _window(mode)
    wall = window_s or watches[0].wall_s
    if io:
        before = judge(watches, backend="nccl", source=NCCL_SOURCE, window_s=wall)
        waiting = {r.rank for r in before.ranks if (r.waiting_pct or 0) >= 50}
        for w in watches:
            if w.rank in waiting:
                w.io = [
                    {"wchar": 0, "syscw": 0, "write_bytes": 0},
                    {"wchar": 50 * MiB, "syscw": 50, "write_bytes": 50 * MiB},
                ]
                w.kernel = [("D", "folio_wait_bit")] * 6 + [("R", "")] * 4
    progress = judge(watches, backend="nccl", source=NCCL_SOURCE, window_s=wall)
    report = analyze(
        Job(job_id="j", world_size=4, backend="nccl"), stacks, [], source=NCCL_SOURCE, progress=progress
    )
    return report.verdict.kind, report.verdict.suspect_ranks


def test_io_on_nccl_ranks_that_wait_for_the_gpu_changes_no_verdict() -> None:
    """The real NCCL captures (tests/data/progress_nccl): bytes and file waits on the ranks that spin
    for the GPU (or in a collective) leave every verdict as it was, and so does a window long enough
    to conclude: a GPU wait is never taken for a loop of the job's own."""
    for mode in NCCL_MODES:
        plain = _nccl_verdict(mode, io=False)
        assert _nccl_verdict(mode, io=True) == plain, mode
        assert _nccl_verdict(mode, io=True, window_s=12.0) == plain, mode


def test_a_gpu_wait_spin_stays_blocked_whatever_its_io_or_the_window() -> None:
    """Real native frames of NCCL ranks spinning in ``cuStreamSynchronize`` under ``loss.item()``
    (tests/data/progress_nccl/sampled/healthy/native_rankR.json), looked at over 12 s with nothing
    completing, 100% CPU and bytes written by the main thread: blocked (a GPU wait keeps its own rule,
    the hang rules), never moving, never a loop of the job's own."""
    import json

    from rankscope.runtime.pyspy import parse_dump
    from tests.unit.test_progress_nccl import DATA
    from tests.unit.test_progress_nccl import SOURCE as NCCL_SOURCE

    watches = []
    for rank in range(4):
        threads = parse_dump(
            json.loads((DATA / "sampled" / "healthy" / f"native_rank{rank}.json").read_text()), 1
        )
        frames = next(t.frames for t in threads if t.is_main)
        watches.append(
            RankWatch(
                rank=rank,
                looks=[frames, frames],
                counters=[{}, {}],
                samples=[(frames, 600)],
                cpu_s=12.0,
                wall_s=12.0,
                io=[{"wchar": 0, "syscw": 0}, {"wchar": 50 * MiB, "syscw": 40}],
                kernel=[("R", "")] * 40,
            )
        )
    progress = judge(watches, backend="nccl", source=NCCL_SOURCE, window_s=12.0)
    assert progress.motion == "no_progress"
    assert all(r.motion == "blocked" and not r.moved and r.loop is None for r in progress.ranks)
    assert progress_verdict(progress, []) is None  # the hang rules decide


def test_a_rank_asleep_in_a_polling_loop_is_concluded_stuck_but_a_blocked_wait_is_left_to_the_rules() -> None:
    """``while not os.path.exists(p): time.sleep(0.05)``: low CPU, a timer in the kernel; over a long
    window it is stuck in that loop. A rank blocked on a futex (a queue, a lock) in a ``for`` loop is
    what the hang rules read (a DataLoader), not a polling loop."""
    source_lines = {**SOURCE_LINES, 42: "        time.sleep(0.05)"}
    source = {(T, n): text for n, text in source_lines.items()}
    asleep = in_main(own(42, "wait_for_marker", p="'/tmp/run/never-created'"))
    polling = in_main(own(41, "wait_for_marker", p="'/tmp/run/never-created'"))
    w = spinner(12.0, frames=asleep)
    w.samples = [(asleep, 550), (polling, 50)]
    w.cpu_s, w.kernel = 0.1, [("S", "hrtimer_nanosleep")] * 19 + [("R", "")]
    watches = [w, *(waiter(r, "all_reduce", 72, 12.0) for r in (0, 2, 3))]
    progress = judge(watches, backend="gloo", source=source, window_s=12.0)
    verdict = progress_verdict(progress, stacks_of(watches))
    assert verdict is not None and verdict.kind == "divergent_ranks" and verdict.suspect_ranks == [1]
    assert "`while not os.path.exists(p)`" in verdict.summary and "never-created" in verdict.summary
    # the same from a short window: its lines moved, so slow or stuck cannot be told yet
    short = progress_verdict(judge(watches, backend="gloo", source=source, window_s=1.2), stacks_of(watches))
    assert short is not None and short.kind == "busy" and "cannot be told yet" in short.summary
    # blocked on a futex at a ``for`` header (a loader's queue): the hang rules decide
    loader = [own(71)]
    w2 = spinner(12.0, frames=loader)
    w2.cpu_s, w2.kernel = 0.0, [("S", "futex_wait_queue")] * 20
    watches = [w2, *(waiter(r, "all_reduce", 72, 12.0) for r in (0, 2, 3))]
    progress = judge(watches, backend="gloo", source=SOURCE, window_s=12.0)
    assert progress_verdict(progress, stacks_of(watches)) is None


def test_a_rank_waiting_for_its_own_writer_thread_moves_by_the_bytes_that_thread_writes() -> None:
    """Rank 0's main thread polls an asynchronous checkpoint (``while not fut.done(): time.sleep(0.1)``)
    while a thread of its own writes: the process's bytes to storage move, so over a long window it is a
    straggler on I/O, not stuck in the polling loop."""
    source_lines = {**SOURCE_LINES, 41: "    while not fut.done():", 42: "        time.sleep(0.1)"}
    source = {(T, n): text for n, text in source_lines.items()}
    asleep = in_main(own(42, "wait_for_marker", fut="<Future at 0x7f01 state=running>"))
    w = spinner(12.0, frames=asleep)
    w.rank, w.cpu_s, w.kernel = 0, 0.05, [("S", "hrtimer_nanosleep")] * 20
    w.io = [
        {"wchar": 0, "syscw": 0, "process_write_bytes": 0},
        {"wchar": 0, "syscw": 0, "process_write_bytes": 40 * MiB},
    ]
    watches = [w, *(waiter(r, "barrier", 77, 12.0) for r in (1, 2, 3))]
    progress = judge(watches, backend="gloo", source=source, window_s=12.0)
    verdict = progress_verdict(progress, stacks_of(watches))
    assert verdict is not None and verdict.kind == "straggler" and verdict.suspect_ranks == [0]
    assert "writing: 40.0 MiB in 12.0 s" in verdict.summary


def test_on_nccl_a_rank_spinning_in_its_own_loop_is_concluded_stuck_while_the_others_spin_for_the_gpu() -> (
    None
):
    """The others' CPUs spin at ``loss.item()`` (a GPU wait: blocked, whatever their CPU); rank 1 spins
    in its own polling loop. The long window names rank 1's loop; the GPU waits keep their rule."""
    source = {**SOURCE, (T, 79): "        print(loss.item())"}
    gpu_wait = [Frame(function="main", file=T, line=79)]
    watches: list[RankWatch] = [spinner(12.0)]
    for r in (0, 2, 3):
        watches.append(
            RankWatch(
                rank=r,
                looks=[gpu_wait, gpu_wait],
                counters=[{}, {}],
                samples=[(gpu_wait, 600)],
                cpu_s=12.0,
                wall_s=12.0,
                io=[{"wchar": 0, "syscw": 0}, {"wchar": 9 * MiB, "syscw": 9}],
            )
        )
    progress = judge(watches, backend="nccl", source=source, window_s=12.0)
    assert [r.motion for r in progress.ranks] == ["blocked", "busy", "blocked", "blocked"]
    stacks = stacks_of(watches)
    for s in stacks:
        if s.rank != 1:
            s.wait = "gpu"
    verdict = progress_verdict(progress, stacks)
    assert verdict is not None and verdict.kind == "divergent_ranks" and verdict.suspect_ranks == [1]
    assert "`while not os.path.exists(p)`" in verdict.summary


def test_a_long_call_that_works_inside_a_library_is_slow_not_stuck() -> None:
    """Rank 1 stands at one line of its own (``model = torch.compile(model)``) for 12 s, but the library
    below it moves from place to place: slow, not stuck. A call whose stack stands still is stuck."""
    inductor = "/venv/lib/python3.11/site-packages/torch/_inductor/compile_fx.py"
    w = spinner(12.0, frames=in_main(own(81, "evaluate"), line=72))
    w.samples = [
        (in_main(Frame(function="f", file=inductor, line=n), own(81, "evaluate"), line=72), 60)
        for n in range(10)
    ]
    watches = [w, *(waiter(r, "all_reduce", 72, 12.0) for r in (0, 2, 3))]
    verdict = verdict_of(watches, 12.0)
    assert verdict.kind == "busy" and verdict.suspect_ranks == [1]
    assert "slow, not stuck" in verdict.summary and "the call it is in moves" in verdict.summary


def test_a_spinning_rank_starved_of_cpu_is_still_busy_from_its_kernel_state() -> None:
    """On a loaded host the spinning rank got 10% of a core, but it was running (or ready to) at every
    kernel look: busy, not blocked, and the long window still concludes stuck in its loop."""
    short = spin_job(1.2)
    short[0].cpu_s = 0.12
    assert watch_rank(short[0], backend="gloo", source=SOURCE).motion == "busy"
    assert verdict_of(short, 1.2).kind == "busy"
    long = spin_job(12.0)
    long[0].cpu_s = 1.2
    verdict = verdict_of(long, 12.0)
    assert verdict.kind == "divergent_ranks" and "CPU 10%" in verdict.summary
    # asleep in a plain wait of its own (a lock: a futex), with little CPU: blocked
    locked = spin_job(1.2)
    locked[0].cpu_s, locked[0].kernel = 0.0, [("S", "futex_wait_queue")] * 20
    assert watch_rank(locked[0], backend="gloo", source=SOURCE).motion == "blocked"


def test_every_rank_writing_at_once_is_progressing_and_says_what_moved() -> None:
    """Every rank saves its shard at once, each in one fsync-bound write: the job moves by its I/O."""
    watches = []
    for r in range(4):
        w = writer(places=(34,), kernel=[("D", "folio_wait_bit")] * 10)
        w.rank = r
        watches.append(w)
    progress = judge(watches, backend="gloo", source=SOURCE, window_s=1.2)
    assert progress.motion == "moving" and "every rank moved (io) in 1.2 s" in progress.summary
    verdict = progress_verdict(progress, stacks_of(watches))
    assert verdict is not None and verdict.kind == "progressing"


def test_a_long_call_in_a_training_loops_body_is_not_that_loop_turning() -> None:
    """Rank 1 stands at ``train_step(model, x)`` inside ``for step in ...`` for the whole window with
    its stack still: it is stuck in that call, not turning the training loop. A loop whose body is that
    one statement does turn (``while True: poll()``)."""
    call = in_main(
        Frame(function="svd", file="/venv/lib/python3.11/site-packages/torch/linalg.py", line=9), line=72
    )
    verdict = verdict_of(spin_job(12.0, frames=call), 12.0)
    assert verdict.kind == "divergent_ranks" and verdict.confidence == "medium"
    assert "for step" not in verdict.summary and "longer than the window" in verdict.summary
    source = {
        (T, 90): "def poll_forever():",
        (T, 91): "    while True:",
        (T, 92): "        poll()",
        (T, 93): "",
    }
    poll = [
        Frame(function="select", file="/usr/lib/python3.11/selectors.py", line=3),
        own(92, "poll_forever"),
    ]
    found = stuck_loop([poll, poll], poll, {}, source)
    assert found is not None and found.loop.line == 91
    # ``while True: if os.path.exists(p): break``: the break is never reached, the if line turns alone
    source = {
        (T, 95): "    while True:",
        (T, 96): "        if os.path.exists(p):",
        (T, 97): "            break",
    }
    check = [Frame(function="exists", file=GENERICPATH, line=19), own(96, p="'/x'")]
    found = stuck_loop([check, check], check, own_reprs(check), source)
    assert found is not None and found.conditions == ("os.path.exists(p)",) and found.values == {"p": "'/x'"}


def test_a_loops_raise_under_a_condition_is_one_of_its_conditions() -> None:
    source = {
        (T, 100): "    while not os.path.exists(p):",
        (T, 101): "        if time.monotonic() > deadline:  # give up",
        (T, 102): "            raise TimeoutError(p)",
    }
    spin = [Frame(function="exists", file=GENERICPATH, line=19), own(100, p="'/x'", deadline="99.5")]
    found = stuck_loop([spin, spin], spin, own_reprs(spin), source)
    assert found is not None and found.conditions == ("not os.path.exists(p)", "time.monotonic() > deadline")
    assert found.values == {"p": "'/x'", "deadline": "99.5"}


def test_a_rank_runnable_in_most_looks_with_no_cpu_is_not_busy() -> None:
    """On a loaded host a rank that sleeps between polls queues for a core on every wake-up: runnable
    in most looks, yet it got no CPU. A starved spinner still gets a few percent."""
    from rankscope.analysis.hang.progress import _runnable

    assert not _runnable({"running": 98}, 0)
    assert _runnable({"running": 98}, 12) and _runnable({"running": 98}, None)
    assert not _runnable({"running": 20}, 12)
