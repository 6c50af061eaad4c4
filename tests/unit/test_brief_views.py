"""The brief views (an agent's, the MCP text) say everything the plain views do, in fewer bytes.

``rankscope ps --brief`` once showed one rank as ``rank 0 local ? pid ... ()`` where ``ps`` listed
four with their local ranks, and ``fr``'s bounded view counted the dumps it listed, not the files it
read: a reader could not tell a cut from a broken job.
"""

from __future__ import annotations

from rankscope import api
from rankscope.capabilities.recorder.flight import analyze_flight_recorder
from rankscope.models.core import Job, JobList, RankProcess
from tests.paths import DATA


def _jobs(n: int) -> JobList:
    ranks = [
        RankProcess(
            rank=r,
            local_rank=r % 8,
            pid=1000 + r,
            host="vm",
            state="sleeping",
            rank_source="env:RANK",
            cmdline=["python", "train.py", "--lr", "0.1"],
            python="/usr/bin/python3",
        )
        for r in range(n)
    ]
    job = Job(
        job_id="torchrun:127.0.0.1:29500",
        launcher="torchrun",
        launcher_pid=999,
        world_size=n,
        hosts=["vm"],
        ranks=ranks,
    )
    return JobList(host="vm", jobs=[job])


def test_ps_brief_lists_every_rank_as_ps_does() -> None:
    jobs = _jobs(4)
    plain = list(api.render_answer(jobs) or [])
    text, data = api.shape_answer(api.answer(jobs))
    assert text.splitlines() == plain
    assert [(r["rank"], r["local_rank"], r["rank_source"]) for r in data["jobs"][0]["ranks"]] == [
        (r, r, "env:RANK") for r in range(4)
    ]


def test_ps_brief_counts_what_it_does_not_list() -> None:
    text, _ = api.shape_answer(api.answer(_jobs(70)))
    assert sum(line.startswith("  rank ") for line in text.splitlines()) == 64
    assert "6 more rank process(es) here: ranks 64-69" in text and "rankscope ps" in text


def test_fr_views_count_the_files_read() -> None:
    report = analyze_flight_recorder([str(DATA / "flight" / "gloo_skip")])
    assert len(report.dumps) == 2
    plain = list(api.render_answer(report) or [])
    text, data = api.shape_answer(api.answer(report))
    assert plain[0].startswith("Read 2 dump(s): ranks 0,1 of world 2")
    assert text.splitlines()[0] == plain[0] and data["dumps_read"] == 2
