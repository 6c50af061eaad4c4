"""NCCL RAS answers (tests/data/ras, in NCCL's JSON and text formats) and the verdict they give."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.analysis.hang.ras import finding, parse_json, parse_text
from rankscope.analysis.hang.stacks import analyze
from rankscope.errors import InvalidInput
from rankscope.models.core import Job, RankProcess, RankStack
from rankscope.models.ras import RasStatus
from tests.unit.test_waits_counters_backend import gpu_waiting_ranks

DATA = Path(__file__).parents[1] / "data" / "ras"
PIDS = {41000 + r: r for r in range(8)}


def load(name: str) -> RasStatus:
    text = (DATA / name).read_text()
    return parse_json(text) if name.endswith(".json") else parse_text(text)


def test_json_answer_gives_each_ranks_launch_count() -> None:
    status = load("status_rank5_behind.json")
    assert status.format == "json" and status.nccl_version == "2.29.7"
    world, tp = status.communicators
    assert (world.size, len(world.ranks), tp.size) == (8, 8, 4)
    five = world.ranks[5]
    assert (five.comm_rank, five.pid, five.host, five.launched) == (5, 41005, "10.1.0.12", 312)
    assert five.by_op == {"Broadcast": 1, "AllReduce": 311}
    assert five.error is None


def test_a_rank_behind_that_stays_behind_is_named_with_high_confidence() -> None:
    first, second = load("status_rank5_behind.json"), load("status_rank5_behind_again.json")
    result = finding(first, second, pid_rank=PIDS, world_size=8, interval_s=3)
    assert result.kind == "off_count" and result.suspect_ranks == [5] and result.confidence == "high"
    assert result.progressing is False
    assert "no rank launched anything in 3 s" in result.summary
    assert "rank 5 (pid 41005 on 10.1.0.12) launched 312" in result.evidence[0]
    assert "most ranks launched 313" in result.evidence[0]


def test_one_read_is_medium_and_a_moving_count_is_a_straggler() -> None:
    one = finding(load("status_rank5_behind.json"), pid_rank=PIDS, world_size=8)
    assert one.suspect_ranks == [5] and one.confidence == "medium" and "(one read)" in one.summary
    moving = finding(
        load("status_rank5_behind.json"), load("status_rank5_straggling.json"), world_size=8, interval_s=3
    )
    assert moving.progressing is True and moving.confidence == "low"
    assert "a straggler, not a hang" in moving.summary


def test_ranks_of_other_hosts_map_by_position_only_on_the_world_communicator() -> None:
    result = finding(load("status_rank5_behind.json"), world_size=8)  # no pid of this host known
    assert result.suspect_ranks == [5]
    unknown = finding(load("status_rank5_behind.json"), world_size=16)
    assert unknown.suspect_ranks == [] and "communicator rank 5" in unknown.evidence[0]


def test_a_dead_rank_is_lost() -> None:
    status = load("status_rank2_dead.json")
    assert status.incomplete and status.communicators[0].missing[0].dead
    result = finding(status, pid_rank={41000 + r: r for r in range(4)}, world_size=4)
    assert result.kind == "lost" and result.suspect_ranks == [2] and result.confidence == "high"
    assert "cannot reach rank 2" in result.summary
    assert any("is dead" in e for e in result.evidence)


def test_every_rank_at_the_same_count_points_below_python() -> None:
    result = finding(
        load("status_all_launched.json"), load("status_all_launched.json"), world_size=4, interval_s=3
    )
    assert result.kind == "agree" and result.suspect_ranks == [] and result.progressing is False
    assert "below Python" in result.summary


def test_text_answers_of_older_servers() -> None:
    status = load("status_text_mismatch.txt")
    assert status.format == "text" and status.nccl_version == "2.26.6"
    result = finding(status, pid_rank={41005: 5})
    assert result.suspect_ranks == [5] and "launched 311" in result.evidence[0]
    dead = finding(load("status_text_dead.txt"), pid_rank={41002: 2})
    assert dead.kind == "lost" and dead.suspect_ranks == [2]


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"communicators": 3}'])
def test_broken_json_is_a_clear_error(text: str) -> None:
    with pytest.raises(InvalidInput, match="NCCL RAS"):
        parse_json(text)


def _gpu_waiting_job(n: int) -> tuple[Job, list[RankStack]]:
    """``n`` NCCL ranks all waiting for the GPU at one line, with the pids RAS reports for them."""
    stacks = gpu_waiting_ranks(n, lambda r: {"pid": 41000 + r})
    job = Job(
        job_id="j",
        world_size=n,
        backend="nccl",
        ranks=[RankProcess(rank=r, pid=41000 + r, host="h") for r in range(n)],
    )
    return job, stacks


def test_ras_decides_when_every_cpu_waits_for_the_gpu() -> None:
    job, stacks = _gpu_waiting_job(8)
    bare = analyze(job, stacks, []).verdict
    assert bare.kind == "inconclusive" and bare.suspect_ranks == []
    ras = finding(
        load("status_rank5_behind.json"),
        load("status_rank5_behind_again.json"),
        pid_rank=PIDS,
        world_size=8,
        interval_s=3,
    )
    v = analyze(job, stacks, [], ras=ras).verdict
    assert v.kind == "divergent_ranks" and v.suspect_ranks == [5] and v.confidence == "high"
    assert v.summary.startswith("NCCL RAS: rank 5 is off the others' launch count")
    assert v.evidence[0].startswith("NCCL RAS communicator")


def test_ras_agreeing_says_the_hang_is_below_python_and_ignores_gloo() -> None:
    job, stacks = _gpu_waiting_job(4)
    agree = finding(
        load("status_all_launched.json"), load("status_all_launched.json"), world_size=4, interval_s=3
    )
    v = analyze(job, stacks, [], ras=agree).verdict
    assert v.kind == "all_in_same_collective" and v.suspect_ranks == []
    assert "not at the ranks' code" in v.summary and v.next_steps[0].tool == "analyze_flight_recorder"
    gloo = job.model_copy(update={"backend": "gloo"})
    plain = [
        s.model_copy(
            update={
                "threads": [
                    t.model_copy(update={"frames": [f for f in t.frames if not f.native]}) for t in s.threads
                ]
            }
        )
        for s in stacks
    ]
    assert "NCCL RAS" not in analyze(gloo, plain, [], ras=agree).verdict.summary


def test_same_total_with_another_mix_of_collectives_is_off_count() -> None:
    """Rank 2 broadcast where the others all-reduced once: the totals agree, the mix does not."""
    from rankscope.models.ras import RasComm, RasRank

    ranks = [
        RasRank(
            comm_rank=r,
            pid=41000 + r,
            launched=10,
            by_op={"AllReduce": 10} if r != 2 else {"AllReduce": 9, "Broadcast": 1},
        )
        for r in range(4)
    ]
    status = RasStatus(format="json", communicators=[RasComm(hash="0xabc", size=4, ranks=ranks)])
    result = finding(status, pid_rank={41000 + r: r for r in range(4)}, world_size=4)
    assert result.kind == "off_count" and result.suspect_ranks == [2]
    assert (
        "most ranks launched 10 collectives (AllReduce 10); rank 2 (pid 41002) launched 10 (AllReduce 9, Broadcast 1)"
        in result.evidence[0]
    )


def test_a_text_answer_without_warnings_agrees() -> None:
    healthy = "NCCL version 2.26.6\nGroup  Comms  Nodes  Ranks  Status  Errors\n    0      1      2     16  RUNNING  OK\n"
    result = finding(parse_text(healthy))
    assert result.kind == "agree" and result.suspect_ranks == []
    assert result.summary.startswith(
        "NCCL RAS: no rank is off its communicator's launch count and none is lost"
    )
