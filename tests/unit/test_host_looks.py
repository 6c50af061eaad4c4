"""A multi-host call: each host's evidence, one merge, one verdict with the hosts' source lines;
the job picked once for every host; rankscope looked for on each host.

Pure pieces on hand-built evidence; the search for rankscope runs its real ``sh`` script.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.capabilities import remote
from rankscope.capabilities.remote import (
    FOUND,
    Pick,
    find_rankscope_argv,
    jobs_on_hosts,
    judge_looks,
    one_job,
    parse_look,
    stacks_argv,
)
from rankscope.errors import NoJobsFound
from rankscope.models.core import (
    CodeRoots,
    Frame,
    Job,
    RankProcess,
    RankStack,
    StacksReport,
    ThreadStack,
    Verdict,
)
from rankscope.models.flight import FlightReport
from rankscope.models.look import HostLook, JobChoice, SourceLine
from rankscope.options import DumpOptions
from tests.paths import DATA

TRAIN = "/nowhere/on/this/host/train.py"
CHECKPOINT = """\
def save_checkpoint(model):
    dist.barrier()

def train():
    for step in range(100):
        dist.all_reduce(grad)
        if rank == 0 and step % 50 == 0:
            save_checkpoint(model)
"""
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _stack(rank: int, host: str) -> RankStack:
    inner = (
        [
            Frame(function="barrier", file=C10D, line=5356),
            Frame(function="save_checkpoint", file=TRAIN, line=2),
        ]
        if rank == 0
        else [Frame(function="all_reduce", file=C10D, line=3252)]
    )
    frames = [*inner, Frame(function="train", file=TRAIN, line=8 if rank == 0 else 6)]
    return RankStack(
        rank=rank, pid=10 + rank, host=host, threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)]
    )


def _look(host: str, ranks: list[int], job_id: str = "torchrun:a", **kw: object) -> HostLook:
    job = Job(
        job_id=job_id,
        world_size=4,
        backend="gloo",
        ranks=[RankProcess(pid=10 + r, rank=r, host=host) for r in ranks],
    )
    lines = [SourceLine(file=TRAIN, line=n, text=t) for n, t in enumerate(CHECKPOINT.splitlines(), 1)]
    return HostLook(host=host, job=job, stacks=[_stack(r, host) for r in ranks], source=lines, **kw)


def test_one_verdict_reads_the_guard_from_the_hosts_source_lines() -> None:
    """The source file is not on the collecting host: the hosts' lines carry the guard."""
    assert not Path(TRAIN).exists()
    results = {"node1": _look("node1", [0, 1]), "node2": _look("node2", [2, 3])}
    report = judge_looks(results, ["node1", "node2"], ["collected via ssh in 1.0s"])
    assert {r.rank: r.host for r in report.job.ranks} == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    assert report.job.missing_ranks == []
    assert report.verdict.kind == "mismatched_collectives" and report.verdict.suspect_ranks == [0]
    assert "`if rank == 0 and step % 50 == 0:` guards the barrier" in report.verdict.summary


def test_a_whole_report_from_an_older_host_is_read_as_its_evidence() -> None:
    look = _look("node1", [0, 1])
    old = StacksReport(job=look.job, stacks=look.stacks, verdict=Verdict(kind="inconclusive", summary="x"))
    parsed = parse_look("node1", "warning: x\n" + old.model_dump_json())
    assert isinstance(parsed, HostLook) and parsed.job is not None and len(parsed.stacks) == 2
    assert isinstance(parse_look("node1", look.model_dump_json()), HostLook)
    assert parse_look("node1", "no json").kind == "failed"  # type: ignore[union-attr]
    assert "unreadable" in parse_look("node1", '{"host": 3}').message  # type: ignore[union-attr]


def _choices(host: str) -> HostLook:
    return HostLook(
        host=host,
        choices=[
            JobChoice(
                job_id="torchrun:a", world_size=4, ranks=[0, 1] if host == "node1" else [2, 3], cwd="/x/a"
            ),
            JobChoice(
                job_id="torchrun:b", world_size=4, ranks=[0, 1] if host == "node1" else [2, 3], cwd="/x/b"
            ),
        ],
    )


def test_several_jobs_are_listed_once_for_all_hosts() -> None:
    looks = {"node1": _choices("node1"), "node2": _choices("node2")}
    assert one_job(looks) is None
    assert jobs_on_hosts(looks) == [
        "torchrun:a (world size 4, ranks 0-1 on node1, 2-3 on node2, started in /x/a)",
        "torchrun:b (world size 4, ranks 0-1 on node1, 2-3 on node2, started in /x/b)",
    ]


def test_the_job_every_host_is_asked_for_again() -> None:
    # one host found the job started in the caller's folder: the others are asked for it by id
    by_folder = {"node1": _look("node1", [0, 1], chosen_by="folder"), "node2": _choices("node2")}
    assert one_job(by_folder) == "torchrun:a"
    # a host's only job, which the undecided host runs too
    only = {"node1": _look("node1", [0, 1], chosen_by="only"), "node2": _choices("node2")}
    assert one_job(only) == "torchrun:a"
    # every host picked the same job: nothing to ask again
    same = {
        "node1": _look("node1", [0, 1], chosen_by="only"),
        "node2": _look("node2", [2, 3], chosen_by="only"),
    }
    assert one_job(same) is None
    # two hosts, two different only jobs, no folder: nothing settles it
    split = {"node1": _look("node1", [0, 1], chosen_by="only"), "node2": _look("node2", [2, 3], "torchrun:b")}
    assert one_job(split) is None


def test_each_host_is_told_which_job() -> None:
    argv = stacks_argv(DumpOptions(), pick=Pick(job_id="torchrun:a", here="/x/a"))
    assert argv[4:6] == ["--job", "torchrun:a"] and "--here" not in argv
    assert stacks_argv(DumpOptions(), pick=Pick(here="/x/a"))[4:6] == ["--here", "/x/a"]
    assert stacks_argv(DumpOptions(), pick=Pick(pid=7, job_id="j"))[4:6] == ["--pid", "7"]


def _find(own: list[str], path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        find_rankscope_argv(["--version"], own),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": path},
    )


def test_rankscope_is_found_at_the_callers_path_and_says_so(tmp_path: Path) -> None:
    """Not on the PATH: the collecting rankscope's own path answers, and the script names it."""
    res = _find([sys.executable, "-m", "rankscope"], "/usr/bin:/bin")
    assert res.returncode == 0 and "rankscope" in res.stdout
    assert f"{FOUND}{sys.executable} -m rankscope" in res.stderr
    (tmp_path / "rankscope").write_text("#!/bin/sh\necho on-path\n")
    (tmp_path / "rankscope").chmod(0o755)
    res = _find(["/missing/rankscope"], f"{tmp_path}:/usr/bin:/bin")
    assert res.stdout.strip() == "on-path" and f"{FOUND}rankscope" in res.stderr


def test_no_rankscope_anywhere_is_not_installed() -> None:
    res = _find(["/missing/rankscope"], "/usr/bin:/bin")
    if res.returncode == 0:  # a job's rank on this machine had rankscope importable: it answered
        assert f"{FOUND}" in res.stderr and "-m rankscope" in res.stderr
        return
    err = remote.classify_failure("n1", "ssh", res.returncode, res.stderr, timed_out=False, timeout=5)
    assert err.kind == "not_installed"


def test_own_command_is_an_absolute_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    exe = tmp_path / "rankscope"
    exe.write_text("")
    monkeypatch.setattr(sys, "argv", [str(exe), "stacks"])
    assert remote.own_command() == [str(exe)]
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert remote.own_command() == [sys.executable, "-m", "rankscope"]


def test_a_host_without_the_job_is_a_note_not_a_failure() -> None:
    """A node of the list that runs no rank of the job answered: it is not an access problem."""
    results = {
        "node1": _look("node1", [0, 1]),
        "node2": _look("node2", [2, 3]),
        "node3": HostLook(host="node3", absent="No job 'torchrun:a' on this host."),
    }
    report = judge_looks(results, ["node1", "node2", "node3"], [])
    assert report.errors == [] and report.verdict.suspect_ranks == [0]
    assert "no rank of the job on node3" in report.job.notes
    assert not any("could not collect" in e for e in report.verdict.evidence)
    nowhere = {
        h: HostLook(host=h, absent="No distributed PyTorch job found on this host.") for h in ("n1", "n2")
    }
    with pytest.raises(NoJobsFound, match="n1, n2"):
        judge_looks(nowhere, ["n1", "n2"], [])


def test_the_hosts_recorder_dumps_are_analysed_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each host read its own rank's dump; on a shared folder the collecting host reads both and
    the recorder's finding covers the whole job, not one host's half."""
    from rankscope.analysis.recorder.flight import analyze as analyze_flight
    from rankscope.capabilities.recorder.flight import read_dumps

    folder = DATA / "flight" / "gloo_skip"
    halves = {}
    for rank, host in ((0, "node1"), (1, "node2")):
        dumps, errors = read_dumps([str(folder / f"fr_trace_rank_{rank}")])
        halves[host] = analyze_flight(dumps, errors, world_size=2)
    looks = {
        h: _look(h, [r], flight=halves[h]).model_copy(update={"source": []})
        for h, r in (("node1", 0), ("node2", 1))
    }
    seen = {}

    def analyze(*args: object, **kw: object) -> StacksReport:
        seen["flight"] = args[3]
        return StacksReport(job=args[0], verdict=Verdict(kind="inconclusive", summary="x"))

    monkeypatch.setattr("rankscope.capabilities.judge.analyze", analyze)
    report = judge_looks(looks, ["node1", "node2"], [])
    flight = seen["flight"]
    assert isinstance(flight, FlightReport) and flight.ranks == [0, 1]
    assert flight.verdict.kind == "divergent_ranks" and "rank 1 never entered" in flight.verdict.summary
    assert "flight recorder: the dumps of 2 hosts analysed together" in report.job.notes


def test_a_pid_on_another_host_adds_that_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--pid node2:4242`` asks node2 for the launcher's job and the other hosts for it by id."""
    from rankscope.capabilities import live_call
    from rankscope.cli import main

    calls: list[tuple[object, dict[str, object]]] = []

    def fake(target: object, options: object, **kw: object) -> StacksReport:
        calls.append((target, kw))
        return StacksReport(job=Job(job_id="j"), verdict=Verdict(kind="inconclusive", summary="x"))

    monkeypatch.setattr(live_call, "dump_stacks_remote", fake)
    assert main(["stacks", "--hosts", "node1", "--pid", "node2:4242", "--json"]) == 0
    [(target, kw)] = calls
    assert target.hosts == ("node1", "node2")  # type: ignore[attr-defined]
    assert kw["pids"] == {"node2": 4242} and kw["pid"] is None
    with pytest.raises(SystemExit) as bad:
        main(["stacks", "--pid", "node2:x"])
    assert bad.value.code == 2


def test_a_host_picks_the_job_of_the_callers_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """On one host of a multi-host call: the job started in the caller's folder (or a folder above
    it), else the only job; several and none started there: every job, as a choice."""
    from rankscope.capabilities import discovery
    from rankscope.errors import ProcessNotFound

    jobs = [
        Job(
            job_id=f"torchrun:{n}",
            world_size=4,
            launcher_pids=[p],
            ranks=[RankProcess(pid=p + 1, rank=0, host="h")],
        )
        for n, p in (("a", 100), ("b", 200))
    ]
    folders = {"torchrun:a": "/data/a", "torchrun:b": "/data/b"}
    monkeypatch.setattr(discovery, "scan", dict)
    monkeypatch.setattr(discovery, "build_jobs", lambda procs, host: list(jobs))
    monkeypatch.setattr(discovery, "job_cwd", lambda job: folders[job.job_id])
    job, how, _ = discovery.pick_job(None, None, "/data/b/run")
    assert job is not None and job.job_id == "torchrun:b" and how == "folder"
    job, how, choices = discovery.pick_job(None, None, "/elsewhere")
    assert job is None and how is None
    assert [(c.job_id, c.cwd, c.launcher_pids) for c in choices] == [
        ("torchrun:a", "/data/a", [100]),
        ("torchrun:b", "/data/b", [200]),
    ]
    job, how, _ = discovery.pick_job(None, "torchrun:a", "/data/b")
    assert job is not None and job.job_id == "torchrun:a" and how == "job_id"
    with pytest.raises(ProcessNotFound):
        discovery.pick_job(None, "torchrun:c", None)
    del jobs[1]
    job, how, _ = discovery.pick_job(None, None, "/elsewhere")
    assert job is not None and job.job_id == "torchrun:a" and how == "only"


def test_a_job_moving_on_every_host_is_progressing_not_hung() -> None:
    """Each host watched its own ranks move (their step counter grew): merged, the job moves,
    even though one instant of it, ranks standing in a collective, looks like a hang."""
    from rankscope.analysis.hang.progress import judge
    from tests.unit.test_progress import all_reduce, stacks_at, watch

    results: dict[str, HostLook] = {}
    for host, ranks in (("node1", [0, 1]), ("node2", [2, 3])):
        moving = judge(
            [watch(r, all_reduce(30), all_reduce(30), counters=(5, 9)) for r in ranks],
            backend="gloo",
            source={},
            window_s=1.0,
        )
        look = _look(host, ranks, progress=moving)
        stacks = [
            s.model_copy(update={"host": host}) for s in stacks_at([all_reduce(30)] * 4) if s.rank in ranks
        ]
        results[host] = look.model_copy(update={"stacks": stacks, "source": []})
    report = judge_looks(results, ["node1", "node2"], [])
    assert report.progress is not None and report.progress.motion == "moving"
    assert report.verdict.kind == "progressing", report.verdict


def test_each_hosts_roots_travel_with_its_look_and_tell_the_jobs_own_frames() -> None:
    """A script in a folder named ``site-packages``: from the path alone it would read as a library;
    the roots each host read from its ranks say it is the job's own, on the collecting host too."""
    own = "/home/u/proj/site-packages/train.py"
    roots = CodeRoots(stdlib=["/usr/lib/python3.11"], site=["/venv/lib/python3.11/site-packages"])

    def sent(host: str, ranks: list[int], with_roots: bool) -> HostLook:
        look = _look(host, ranks, code_roots=roots if with_roots else None)
        moved = look.model_dump_json().replace(TRAIN, own)  # as a host answers: JSON, no frame origins
        parsed = parse_look(host, moved)
        assert isinstance(parsed, HostLook)
        return parsed

    told = {"node1": sent("node1", [0, 1], True), "node2": sent("node2", [2, 3], True)}
    assert told["node1"].code_roots == roots
    report = judge_looks(told, ["node1", "node2"], [])
    assert report.verdict.suspect_ranks == [0]
    assert "`if rank == 0 and step % 50 == 0:` guards the barrier" in report.verdict.summary
    untold = {"node1": sent("node1", [0, 1], False), "node2": sent("node2", [2, 3], False)}
    assert "guards the barrier" not in judge_looks(untold, ["node1", "node2"], []).verdict.summary
