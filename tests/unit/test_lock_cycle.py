"""The lock-order deadlock rule: threads of one rank, each holding a lock another waits for.

Stacks are built by hand as py-spy reports them (innermost first) for the job's file
``/job/train.py``, with the source lines a capture reads around them.
"""

from __future__ import annotations

from pathlib import Path

from rankscope.analysis.hang.locks import lock_cycle, lock_names
from rankscope.analysis.hang.verdict import decide
from rankscope.capabilities.stacks import source_lines
from rankscope.capabilities.workers import with_workers
from rankscope.models.core import Frame, RankStack, StacksReport, ThreadStack
from rankscope.models.look import WorkerLine
from tests.verdict_builders import JOB_FILE, facts_of, rank, source

THREADING = "/usr/lib/python3.11/threading.py"

CODE = {
    45: "    def saver() -> None:",
    46: "        with a:",
    47: "            a_held.set()",
    48: "            b_held.wait()",
    49: "            with b:",
    50: "                pass",
    51: "",
    52: "    def logger() -> None:",
    53: "        with b:",
    54: "            b_held.set()",
    55: "            a_held.wait()",
    56: "            with a:",
    57: "                pass",
    58: "",
    59: "    def flusher() -> None:",
    60: "        c.acquire()",
    61: "        try:",
    62: "            log('flush')",
    63: "            b.acquire()",
    64: "        finally:",
    65: "            c.release()",
    70: "    def waiter() -> None:",
    71: "        with cond:",
    72: "            cond.wait()",
}


def thread(
    tid: int, name: str, function: str, line: int, *native: str, inner: tuple[Frame, ...] = ()
) -> ThreadStack:
    """A thread started by threading, stopped at train.py:``line`` in ``function``."""
    frames = [
        *(Frame(function=n, file="libc.so.6", native=True) for n in native),
        *inner,
        Frame(function=function, file=JOB_FILE, line=line),
        Frame(function="run", file=THREADING, line=1012),
        Frame(function="_bootstrap_inner", file=THREADING, line=1075),
    ]
    return ThreadStack(thread_id=tid, name=name, frames=frames)


def joining() -> ThreadStack:
    """The main thread, joining the others: it waits for a thread, not for a lock it needs."""
    frames = [
        Frame(function="_wait_for_tstate_lock", file=THREADING, line=1167),
        Frame(function="join", file=THREADING, line=1147),
        Frame(function="lock_cycle", file=JOB_FILE, line=80),
        Frame(function="main", file=JOB_FILE, line=10),
    ]
    return ThreadStack(thread_id=1, name="MainThread", is_main=True, frames=frames)


def locked(r: int, *threads: ThreadStack) -> RankStack:
    """Rank ``r`` in no collective, its main thread joining ``threads``."""
    return rank(r, line=80).model_copy(update={"threads": [joining(), *threads]})


SAVER = thread(2, "saver", "saver", 49)
LOGGER = thread(3, "logger", "logger", 56)


def test_two_threads_taking_two_locks_in_opposite_order_are_the_verdict_on_gloo() -> None:
    stacks = [rank(0, "all_reduce"), locked(1, LOGGER, SAVER), rank(2, "all_reduce")]  # any order
    v = decide(facts_of(stacks, lines=source(CODE)))
    assert v.kind == "divergent_ranks" and v.suspect_ranks == [1] and v.confidence == "high", v
    assert v.summary.startswith("rank 1 is in a lock-order deadlock (lock cycle `a` -> `b` -> `a`)"), (
        v.summary
    )
    assert "one order" in v.summary and "saver and logger" in v.summary
    assert v.evidence[:2] == [
        "rank 1 thread saver holds `a` (taken at train.py:46) and waits for `b` at train.py:49",
        "rank 1 thread logger holds `b` (taken at train.py:53) and waits for `a` at train.py:56",
    ], v.evidence


def test_on_nccl_the_others_waiting_for_the_gpu_leave_the_cycle_sure() -> None:
    others = [rank(r, line=30, wait="gpu") for r in (0, 2, 3)]
    v = decide(facts_of([*others, locked(1, SAVER, LOGGER)], backend="nccl", lines=source(CODE)))
    assert v.kind == "divergent_ranks" and v.suspect_ranks == [1] and v.confidence == "high", v
    assert "lock cycle `a` -> `b` -> `a`" in v.summary and "train.py:49" in v.evidence[0], v


def test_without_the_lines_above_no_cycle_is_claimed() -> None:
    stacks = [rank(0, "all_reduce"), locked(1, SAVER, LOGGER)]
    v = decide(facts_of(stacks, lines=source({49: CODE[49], 56: CODE[56]})))
    assert (
        v.kind == "divergent_ranks"
        and "lock-order" not in v.summary
        and not any("holds" in e for e in v.evidence)
    ), v


def test_acquire_calls_a_three_thread_cycle_and_native_lock_waits() -> None:
    """flusher holds c (acquire, not yet released) and waits for b; saver holds a, waits for b...:
    a cycle a -> b -> ... needs the one holding b to wait for a: logger; flusher is no part of it."""
    flusher = thread(4, "flusher", "flusher", 63, "futex_wait", "lock_PyThread_acquire_lock")
    s = locked(1, flusher, SAVER, LOGGER)
    cycle = lock_cycle(s, source(CODE))
    assert cycle is not None and [t.thread for t in cycle.threads] in (
        ["saver", "logger"],
        ["logger", "saver"],
    )
    three = {**CODE, 49: "            with c:"}  # saver now waits for c: a -> c -> b -> a
    cycle = lock_cycle(s, source(three))
    assert cycle is not None and len(cycle.threads) == 3 and cycle.confidence == "high", cycle
    assert {t.thread for t in cycle.threads} == {"saver", "logger", "flusher"}
    assert any("holds `c` (taken at train.py:60)" in e for e in cycle.evidence())


def test_a_thread_not_waiting_on_a_lock_is_no_part_of_a_cycle() -> None:
    busy = thread(2, "saver", "saver", 49, "epoll_wait")  # its native frames wait for something else
    assert lock_cycle(locked(1, busy, LOGGER), source(CODE)) is None
    cond = Frame(function="wait", file=THREADING, line=320)
    waiting = thread(5, "waiter", "waiter", 72, inner=(cond,))  # Condition.wait releases the lock
    assert lock_cycle(locked(1, waiting, LOGGER), source(CODE)) is None


def test_a_lock_held_by_the_caller_is_read_and_a_subscript_name_is_less_sure() -> None:
    code = {
        10: "def take(lock):",
        11: "    with lock:",
        20: "def one():",
        21: "    with locks[0]:",
        22: "        take(locks[1])",
        30: "def two():",
        31: "    with locks[1]:",
        32: "        take(locks[0])",
    }
    inner = Frame(function="take", file=JOB_FILE, line=11)
    one = ThreadStack(thread_id=2, name="one", frames=[inner, Frame(function="one", file=JOB_FILE, line=22)])
    two = ThreadStack(thread_id=3, name="two", frames=[inner, Frame(function="two", file=JOB_FILE, line=32)])
    helper = {**CODE, 10: "def take_b():", 11: "    with b:", 48: "            take_b()"}
    called = ThreadStack(
        thread_id=2, name="saver", frames=[Frame(function="take_b", file=JOB_FILE, line=11), *SAVER.frames]
    )
    called.frames[1] = Frame(function="saver", file=JOB_FILE, line=48)
    cycle = lock_cycle(locked(1, called, LOGGER), source(helper))
    assert cycle is not None and cycle.threads[0].held_where("a") == "train.py:46", cycle
    # both wait at `with lock:`: one name for two locks, so the waits cannot be told apart
    assert lock_cycle(locked(1, one, two), source(code)) is None
    code.update(
        {22: "        with locks[1]:", 32: "        with locks[0]:"}
    )  # now each waits in its own frame
    one = one.model_copy(update={"frames": one.frames[1:]})
    two = two.model_copy(update={"frames": two.frames[1:]})
    cycle = lock_cycle(locked(1, one, two), source(code))
    assert cycle is not None and cycle.confidence == "medium", cycle  # `locks[0]` may name another list's
    assert lock_names("    with locks[1 - i]:") == ["locks[1 - i]"]
    assert lock_names('with open(p, "rb") as f:') == []
    assert lock_names("with lock_for(key):") == ["lock_for(key)"]
    assert lock_names("with self._lock, other as o:  # both") == ["self._lock", "other"]


def test_the_capture_reads_the_lines_above_each_thread_blocked_taking_a_lock(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    text = "\n".join(CODE.get(n, "") for n in range(1, 81))
    script.write_text(text + "\n")
    here = str(script)

    def at(t: ThreadStack) -> ThreadStack:
        return t.model_copy(
            update={
                "frames": [f.model_copy(update={"file": here}) if f.file == JOB_FILE else f for f in t.frames]
            }
        )

    stack = locked(1, at(SAVER), at(LOGGER)).model_copy(
        update={"threads": [at(joining()), at(SAVER), at(LOGGER)]}
    )
    lines = source_lines([stack])
    assert {(here, n) for n in (45, 46, 49, 52, 53, 56)} <= set(lines), sorted(lines)
    cycle = lock_cycle(stack, lines)
    assert cycle is not None and cycle.locks == ("a", "b"), cycle


def test_the_threads_kernel_waits_follow_the_cycle_and_leave_its_summary_alone() -> None:
    stacks = [rank(0, "all_reduce"), locked(1, SAVER, LOGGER)]
    facts = facts_of(stacks, lines=source(CODE))
    v = decide(facts)
    v = v.model_copy(update={"evidence": ["window: nothing moved", *v.evidence]})  # as a live call leads
    report = StacksReport(verdict=v, job=facts.job)
    note = "rank 1's thread logger (tid 12) waits at train.py:56 in logger (`with a:`), in the kernel at futex_wait"
    told = with_workers(report, [WorkerLine(rank=1, text=note)]).verdict
    assert told.summary == v.summary and told.next_steps == v.next_steps
    assert told.evidence == [*v.evidence[:3], note, *v.evidence[3:]]
