"""Every `left out` hint of a stacks answer, followed literally on the CLI, gives more of the same answer.

The hint once said ``--rank N``, which captured rank N alone: the verdict changed and the suspect was
lost. Now each hint names ``--last`` (the capture just answered, kept for this) with ``--show-rank``
or ``--full``, and the test runs exactly what each hint says, in the form it was read in (``--brief``,
``--json``), and checks that the verdict is the one it came from. ``--only-rank``, the smaller
capture, says that its verdict covers only its ranks and names the suspects of the whole job.
(The MCP side, ``dump_stacks(last=true, full_ranks=[N])``, is followed in test_mcp_server.py.)
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import uuid

import pytest

from rankscope import cli
from rankscope.capabilities.discovery import ProcInfo, build_jobs
from tests.jobs import JobFactory, RunningJob
from tests.readme import README

_CLI_FORM = re.compile(r"\(CLI: ([^)]*)\)")


def _cli(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    assert code == 0, (argv, err.getvalue())
    return code, out.getvalue()


def _hinted(hints: list[str], rank: int) -> list[list[str]]:
    """The CLI call each hint names, with N as ``rank``; every hint of a stacks answer names one."""
    calls = []
    for hint in hints:
        forms = _CLI_FORM.findall(hint)
        assert forms, f"a left-out hint without its CLI form: {hint}"
        for form in forms:
            words = form.split()
            assert words[0] == "rankscope", f"a hint's CLI form is a whole command line: {hint}"
            calls.append([word if word != "N" else str(rank) for word in words[1:]])
    return calls


@pytest.fixture(scope="module")
def hung(module_jobs: JobFactory, pyspy_works: str) -> RunningJob:
    """One hung job for the module: the tests only read it, and each keeps its own captures
    (``--last``) apart through conftest's per-test cache folder."""
    job = module_jobs.torchrun("mcp_hang.py", nproc=2, args=["--mode", "divergent"])
    job.wait_ready(["rank0", "rank1"])
    return job


def _verdict(job: RunningJob) -> dict[str, object]:
    """The job's verdict once both ranks block (rank 0 marks itself ready just before all_reduce)."""
    for _ in range(30):
        _, out = _cli("stacks", "--pid", str(job.pid), "--json")
        data = json.loads(out)
        if data["verdict"]["kind"] == "divergent_ranks":
            return data
    raise AssertionError(f"no divergent_ranks verdict: {data['verdict']}")


@pytest.mark.slow
def test_each_hint_followed_literally_gives_more_of_the_same_answer(hung: RunningJob) -> None:
    first = _verdict(hung)
    suspect = first["verdict"]["suspect_ranks"][0]  # type: ignore[index]
    assert suspect == 1
    hints = [first["hint"], *first.get("left_out", [])]  # type: ignore[list-item]
    calls = _hinted(hints, suspect)  # type: ignore[arg-type]
    assert ["stacks", "--last", "--show-rank", "1"] in calls
    for call in calls:
        _, out = _cli(*call, "--json")
        again = json.loads(out)
        assert again["verdict"] == first["verdict"], call
        if "--show-rank" in call:
            assert [s["rank"] for s in again["stacks"] if s.get("threads")] == [suspect]
    _, brief = _cli("stacks", "--last", "--brief")
    lines = [line.removeprefix("left out: ") for line in brief.splitlines() if line.startswith("left out: ")]
    for call in _hinted(lines, suspect):
        _, out = _cli(*call, "--brief")
        assert out.splitlines()[0] == brief.splitlines()[0], call  # the same verdict line
        if "--show-rank" in call:
            assert f"rank {suspect} stack (main thread, innermost first):" in out
            assert "wait_for_config_reload" in out


@pytest.mark.slow
def test_a_capture_of_some_ranks_says_so_and_keeps_the_suspect_in_view(hung: RunningJob) -> None:
    whole = _verdict(hung)
    _, out = _cli("stacks", "--pid", str(hung.pid), "--only-rank", "0", "--json")
    part = json.loads(out)["verdict"]
    assert json.loads(out)["only_ranks"] == [0]
    assert part["summary"].startswith(  # said first: what one rank shows is no verdict on the job
        "this verdict covers only rank 0 (captured alone); the last capture of every rank said "
        f"{whole['verdict']['kind']}, suspects: rank(s) 1"  # type: ignore[index]
    )
    _, out = _cli("stacks", "--last", "--json")  # the partial capture is the last one answered
    assert json.loads(out)["verdict"] == part
    _, brief = _cli("stacks", "--last", "--brief")
    first, second = brief.splitlines()[:2]
    assert first.startswith("verdict on rank 0 alone: ")
    assert second.startswith("this verdict covers only rank 0")
    _, human = _cli("stacks", "--last")
    assert any(line.startswith("verdict on rank 0 alone: ") for line in human.splitlines())
    code, _ = _cli("stacks", "--pid", str(hung.pid), "--window", "0", "--json")
    assert code == 0
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main(["stacks", "--rank", "1"]) == 2  # one name, one meaning: the old flag says which
    assert "--show-rank" in err.getvalue() and "--only-rank" in err.getvalue()


def _standalone_job_id(run_id: str) -> str:
    """The id printed for a one-node torchrun job whose ranks have torchrun's variables (as
    ``torchrun --nproc_per_node=2 train.py`` gives them: its own rendezvous on localhost)."""
    py = "/usr/bin/python3.11"
    env = {
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "29513",
        "TORCHELASTIC_RUN_ID": run_id,
    }
    agent = ProcInfo(100, 1, "sleeping", 1, [py, "/venv/bin/torchrun", "train.py"], {}, exe=py)
    ranks = [
        ProcInfo(101 + r, 100, "sleeping", 2, [py, "train.py"], {**env, "RANK": str(r)}, exe=py)
        for r in range(2)
    ]
    agent.children = [101, 102]
    (job,) = build_jobs({p.pid: p for p in (agent, *ranks)}, "vm")
    return job.job_id


def test_readmes_job_ids_are_the_ones_printed() -> None:
    """torchrun names a one-node run started without a port with a uuid it logs nowhere: the id is
    the rendezvous address instead, as README shows it (test_readme.py compares README with a live
    run); a ``--rdzv-id`` the person chose is kept."""
    shown = set(re.findall(r"\btorchrun:[\w.-]+:\d+", README.read_text(encoding="utf-8")))
    assert shown == {"torchrun:localhost:29513"}
    assert _standalone_job_id(str(uuid.uuid4())) == "torchrun:localhost:29513"
    assert _standalone_job_id("nightly-bert") == "torchrun:nightly-bert"
