"""One verdict from one capture's evidence, for one host or many.

The verdict runs once; only a hang it leaves open asks the job's store and debug server, and only
a recorder from the debug server makes it run a second time. The same holds on the collecting host
of a multi-host call, which also carries the busy workers each host found to the ranks it names.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import pytest

from rankscope.analysis.recorder.flight import analyze as analyze_flight
from rankscope.capabilities import judge
from rankscope.capabilities.judge import judge_look
from rankscope.capabilities.recorder.flight import read_dumps
from rankscope.capabilities.remote import judge_looks, merge_reports
from rankscope.capabilities.workers import WORKER_STEP
from rankscope.models.core import Job, StacksReport, Verdict
from rankscope.models.flight import FlightReport
from rankscope.models.look import HostLook, WorkerLine
from rankscope.options import DEFAULTS, DumpOptions
from tests.jobs import free_port
from tests.paths import DATA
from tests.unit.test_host_looks import _look

WORKER = "rank 0's DataLoader worker (pid 4242) waits at data.py:9 in Shard.__getitem__ (`open(p)`)"


def _recorder() -> FlightReport:
    dumps, errors = read_dumps([str(DATA / "flight" / "gloo_skip" / f"fr_trace_rank_{r}") for r in (0, 1)])
    return analyze_flight(dumps, errors, world_size=2)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every verdict run and follow-up asked; the follow-ups answer nothing unless a test says."""
    seen: dict[str, list[Any]] = {"analyze": [], "store": [], "server": []}
    real = judge.analyze

    def analyze(*args: Any, **kw: Any) -> StacksReport:
        seen["analyze"].append(args[3])
        return real(*args, **kw)

    monkeypatch.setattr(judge, "analyze", analyze)
    monkeypatch.setattr(judge, "exception_dump_note", lambda job: seen["store"].append(job) or None)
    monkeypatch.setattr(
        judge, "debug_server_flight", lambda job, listening: seen["server"].append(listening) or None
    )
    return seen


def _open(monkeypatch: pytest.MonkeyPatch, calls: dict[str, list[Any]]) -> None:
    """Make every verdict an unsure hang, as the stacks of an NCCL job often leave it."""

    def unsure(*args: Any, **kw: Any) -> StacksReport:
        calls["analyze"].append(args[3])
        return StacksReport(job=args[0], verdict=Verdict(kind="inconclusive", confidence="low", summary="?"))

    monkeypatch.setattr(judge, "analyze", unsure)


def test_a_sure_verdict_runs_once_and_asks_nothing_more(calls: dict[str, list[Any]]) -> None:
    report = judge_look(_look("node1", [0, 1, 2, 3]))
    assert report.verdict.confidence == "high" and report.verdict.suspect_ranks == [0]
    assert len(calls["analyze"]) == 1 and calls["store"] == [] and calls["server"] == []


def test_an_open_hang_asks_the_store_and_the_debug_server_and_judges_their_recorder_once_more(
    calls: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _open(monkeypatch, calls)
    recorder = _recorder()
    monkeypatch.setattr(judge, "exception_dump_note", lambda job: "TCPStore h:1: exception_dump=3: ...")
    monkeypatch.setattr(judge, "debug_server_flight", lambda job, listening: recorder if listening else None)
    look = _look("node1", [0, 1, 2, 3], worker_servers=True)
    report = judge_look(look)
    assert calls["analyze"] == [None, recorder]  # the second run only for the recorder it brought
    assert report.job.notes[-2:] == [
        "TCPStore h:1: exception_dump=3: ...",
        "flight recorder: 2 trace(s) from the job's debug server, analysed with the stacks",
    ]
    calls["analyze"].clear()
    report = judge_look(look.model_copy(update={"worker_servers": False}))
    assert calls["analyze"] == [None]  # nothing new: the note is added, the verdict is not run again
    assert report.job.notes[-1] == "TCPStore h:1: exception_dump=3: ..."


def test_the_options_and_a_recorder_already_found_spare_the_follow_ups(
    calls: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _open(monkeypatch, calls)
    judge_look(_look("node1", [0, 1, 2, 3], worker_servers=True), DumpOptions(flight_recorder=False))
    assert calls["store"] == [] and calls["server"] == []
    judge_look(_look("node1", [0, 1, 2, 3], flight=_recorder(), worker_servers=True))
    assert len(calls["store"]) == 1 and calls["server"] == []  # a recorder is there: no debug server


def test_the_collecting_host_reads_the_jobs_store_and_asks_the_debug_server_a_host_saw(
    calls: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across hosts the follow-ups run where the verdict is made: the store at the job's master
    address (a real TCPStore here), the debug server where any host saw a rank listen for one."""
    from torch.distributed import TCPStore

    from rankscope.capabilities.recorder import pickup

    _open(monkeypatch, calls)
    monkeypatch.setattr(judge, "exception_dump_note", pickup.exception_dump_note)
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    store.set(pickup.EXCEPTION_DUMP, (3).to_bytes(4, sys.byteorder, signed=True))
    looks = {}
    for host, ranks in (("node1", [0, 1]), ("node2", [2, 3])):
        look = _look(host, ranks, worker_servers=host == "node2")
        assert look.job is not None
        job = look.job.model_copy(update={"backend": "nccl", "master_addr": "127.0.0.1", "master_port": port})
        looks[host] = look.model_copy(update={"job": job})
    report = judge_looks(looks, ["node1", "node2"], [], DEFAULTS)
    assert any(f"127.0.0.1:{port}: exception_dump=3: rank 3's watchdog" in n for n in report.job.notes)
    assert calls["server"] == [True]
    del store


def test_a_hosts_workers_follow_the_rank_the_verdict_names(calls: dict[str, list[Any]]) -> None:
    """node1 found rank 0's busy worker, node2 rank 2's: the verdict names rank 0, so only its
    worker is quoted, first, with the step that fixes its wait."""
    other = "rank 2's DataLoader worker (pid 99) waits at data.py:9"
    looks = {
        "node1": _look("node1", [0, 1], workers=[WorkerLine(rank=0, text=WORKER)]),
        "node2": _look("node2", [2, 3], workers=[WorkerLine(rank=2, text=other)]),
    }
    v = judge_looks(looks, ["node1", "node2"], []).verdict
    assert v.suspect_ranks == [0] and v.summary.endswith(f"; {WORKER}")
    assert v.evidence[0] == WORKER and other not in " ".join(v.evidence)
    assert v.next_steps[0] == WORKER_STEP


def test_the_hosts_backend_is_kept_and_a_disagreement_is_mixed() -> None:
    def look(host: str, backend: str | None) -> HostLook:
        base = _look(host, [0] if host == "a" else [1])
        assert base.job is not None
        return base.model_copy(update={"job": base.job.model_copy(update={"backend": backend})})

    def backend(*pairs: tuple[str, str | None]) -> str | None:
        job: Job = merge_reports({h: look(h, b) for h, b in pairs}, [], [h for h, _ in pairs])[0]
        return job.backend

    assert backend(("a", "nccl"), ("b", "nccl")) == "nccl"
    assert backend(("a", "nccl"), ("b", None)) == "nccl"
    assert backend(("a", "nccl"), ("b", "gloo")) == "mixed"
    assert backend(("a", None), ("b", None)) is None
