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

import pytest

from rankscope import cli
from tests.jobs import JobFactory, RunningJob

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


@pytest.fixture
def hung(jobs: JobFactory, pyspy_works: str) -> RunningJob:
    job = jobs.torchrun("mcp_hang.py", nproc=2, args=["--mode", "divergent"])
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
    assert "this verdict covers only ranks 0" in part["summary"]
    assert (
        f"the last capture of every rank said {whole['verdict']['kind']}, suspects: rank(s) 1"  # type: ignore[index]
        in part["summary"]
    )
    _, out = _cli("stacks", "--last", "--json")  # the partial capture is the last one answered
    assert json.loads(out)["verdict"] == part
    code, _ = _cli("stacks", "--pid", str(hung.pid), "--window", "0", "--json")
    assert code == 0
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main(["stacks", "--rank", "1"]) == 2  # one name, one meaning: the old flag says which
    assert "--show-rank" in err.getvalue() and "--only-rank" in err.getvalue()
