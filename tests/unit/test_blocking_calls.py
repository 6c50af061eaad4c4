"""The blocking calls a silent rank passes on its way to the collective the others timed out in, read
from the code: which calls can wait for good, what ends each wait, and what is not one."""

from __future__ import annotations

from rankscope.analysis.triage.blocking_calls import MAX_CALLS, blocking_calls
from rankscope.analysis.triage.silent import silent_site, silent_story
from rankscope.capabilities.triage import triage_logs
from rankscope.models.core import Finding
from rankscope.models.logs import SilentRanks
from tests.paths import DATA

TRAIN = """\
import queue, subprocess, threading, time
import torch.distributed as dist

def feed(q, shard, ready):
    ready.wait()
    for item in shard:
        q.put(item)

def fetch(q):
    return q.get()

def train(loader, shard):
    q = queue.Queue()
    ready = threading.Event()
    threading.Thread(target=feed, args=(q, shard, ready)).start()
    lock = threading.Lock()
    cfg = {"a": 1}
    for step, batch in enumerate(loader):
        x = cfg.get("a")
        y = q.get(timeout=5)
        z = fetch(q)
        with lock:
            pass
        dist.all_reduce(batch)
        time.sleep(0.1)
        subprocess.run(["sync"])
"""
"""Line 24 holds the collective."""


def _lines(calls: list) -> list[int]:  # type: ignore[type-arg]
    return [c.line for c in calls]


def test_names_the_calls_that_can_wait_for_good_and_what_ends_each() -> None:
    calls = blocking_calls(TRAIN, 24)
    by_line = {c.line: c for c in calls}
    assert len(calls) <= MAX_CALLS
    # q.get() through fetch (followed once), filled by the thread feed, in a finite loop over shard
    got = by_line[10]
    assert got.via == ":21 `z = fetch(q)`" and got.code == "return q.get()"
    assert "filled by thread feed (started at :15) at :7" in got.waits_on
    assert (
        "no more once `shard` ends" in got.waits_on
        and "after its own wait at :5 `ready.wait()`" in got.waits_on
    )
    assert "held by another thread" in by_line[22].waits_on  # with lock:
    assert "next item of `loader`" in by_line[18].waits_on  # the data loop around the collective
    # after the collective, in the loop: the next pass passes it first; the farthest is cut by MAX_CALLS
    assert by_line[25].later_in_loop and "sleeps 0.1 s on every pass" in by_line[25].waits_on
    assert 26 not in by_line and _lines(calls) == [10, 18, 22, 25]
    # dict.get(key) and a get with a timeout are no waits
    assert 19 not in by_line and 20 not in by_line


def test_what_is_not_a_wait() -> None:
    source = "import os\ndef f(q, t, e, parts):\n    q.get(block=False)\n    t.join(2)\n    e.wait(timeout=3)\n    os.path.join('a', 'b')\n    ','.join(parts)\n    f.all_reduce()\n"
    assert blocking_calls(source, 8) == []


def test_each_wait_kind_says_what_it_waits_on() -> None:
    source = (
        "import time\n"
        "def f(ev, t, lock, it, p):\n"
        "    while True:\n"
        "        ev.wait()\n"
        "        t.join()\n"
        "        lock.acquire()\n"
        "        b = next(it)\n"
        "        s = input()\n"
        "        out, _ = p.communicate()\n"
        "        time.sleep(5)\n"
        "        collective()\n"
        "def g(ev):\n"
        "    ev.set()\n"
    )
    said = {c.line: c.waits_on for c in blocking_calls(source, 11)}
    assert set(said) == {7, 8, 9, 10}  # the nearest MAX_CALLS
    assert "next item of `it`" in said[7] and "stdin" in said[8] and "sleeps 5 s" in said[10]
    said = {c.line: c.waits_on for c in blocking_calls(source, 7)}
    assert set(said) == {4, 5, 6, 8} and "set at g:13" in said[4] and "`t` to end" in said[5]


def test_a_file_that_does_not_parse_or_a_line_outside_it_gives_nothing() -> None:
    assert blocking_calls("def f(:\n", 1) == []
    assert blocking_calls(TRAIN, 999) == []


def _timeout(rank: int, site: str | None) -> Finding:
    facts: dict[str, object] = {"op": "recv", "timeout_ms": 10000}
    if site:
        facts["call_site"] = site
    return Finding(
        kind="collective_timeout",
        severity="error",
        message="gloo: collective timed out",
        ranks=[rank],
        facts=facts,
    )


def test_the_silent_rank_and_the_collective_come_from_the_findings() -> None:
    findings = [
        _timeout(0, "/x/train.py:24 in train"),
        _timeout(2, "/x/train.py:24 in train"),
        Finding(
            kind="killed_by_signal",
            severity="warning",
            message="killed by SIGTERM",
            ranks=[1],
            facts={"sent_by_launcher": True},
        ),
    ]
    site = silent_site(findings, [1])
    assert site is not None and site.ranks == [1] and site.waited == [0, 2]
    assert (site.file, site.line, site.function) == ("/x/train.py", 24, "train")
    # a suspect that raised its own error is not silent; a timeout without a traceback names no line
    spoke = [*findings, Finding(kind="cuda_oom", severity="error", message="oom", ranks=[1])]
    assert silent_site(spoke, [1]) is None
    assert silent_site([_timeout(0, None)], [1]) is None


def test_the_story_leads_with_who_waited_where_and_says_it_is_read_from_code() -> None:
    s = SilentRanks(
        ranks=[1], waited=[0, 2, 3], collective="/x/train.py:24 in train", code="dist.all_reduce(batch)"
    )
    told = silent_story(s)
    assert told.startswith(
        "Rank 1 left no traceback while ranks 0,2-3 timed out in the collective at /x/train.py:24"
    )
    assert "only a capture of its stack at the stall can say where it was" in told
    with_calls = s.model_copy(update={"calls": blocking_calls(TRAIN, 24)})
    assert "(read from the code, not a stack)" in silent_story(with_calls)


def test_nccl_watchdog_lines_name_no_python_line_so_no_code_is_read() -> None:
    """NCCL's watchdog before torch 2.10 prints the collective but no Python line, and a rank that
    timed out itself is not silent: the logs' own answer stands, unchanged."""
    logs = [DATA / "nccl_uneven" / "torchrun.log", *sorted((DATA / "logs" / "watchdog").glob("*.log"))]
    for log in logs:
        r = triage_logs([str(log)])
        assert r.blocking_calls is None and "left no traceback" not in r.summary, log
        assert r.summary == triage_logs([str(log)], read_code=False).summary
