"""Members of the process group a rank waits on, read from the job's locals, and the verdict on a
rank left waiting in a subgroup. The shapes and reprs are py-spy's, as captured from
tests/programs/hang_subgroup.py under torchrun."""

from __future__ import annotations

import pytest

from rankscope.analysis.hang.group_members import group_table, rank_list, read_group_locals, waited_group
from rankscope.analysis.hang.stacks import analyze
from rankscope.models.core import Frame, Job, LocalVar, RankStack, ThreadStack, Verdict
from rankscope.models.flight import FlightReport

SP = "/usr/lib/python3.11/site-packages/torch/distributed/"
TRAIN = "/job/train.py"
PG = "<torch._C._distributed_c10d.ProcessGroup at 0x{:x}>"
WORLD = 0x7F00_0000_0000


def pg(addr: int) -> str:
    return PG.format(addr)


def c10d(op: str, group: str, passed: str | None) -> list[Frame]:
    """The c10d call, then its logging wrapper holding what the caller passed."""
    kwargs = "{}" if passed is None else f'{{"group": {passed}}}'
    return [
        Frame(
            function=op,
            file=SP + "distributed_c10d.py",
            line=3252,
            locals=[LocalVar(name="group", repr=group)],
        ),
        Frame(
            function="_exception_logger.<locals>.wrapper",
            file=SP + "c10d_logger.py",
            line=83,
            locals=[LocalVar(name="args", repr="(<Tensor at 0x1>)"), LocalVar(name="kwargs", repr=kwargs)],
        ),
    ]


def rank_stack(rank: int, frames: list[Frame]) -> RankStack:
    return RankStack(
        rank=rank,
        pid=100 + rank,
        host="h",
        state="sleeping",
        threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)],
    )


def pairs_job(skipper: int = 3, table: bool = True, rank_lists: bool = False, n: int = 4) -> list[RankStack]:
    """Pairs (0,1), (2,3), ... all-reduce in their own group; ``skipper`` skipped one and waits in the
    world barrier with every other pair, leaving its partner in the pair's all_reduce."""
    partner = skipper ^ 1
    stacks = []
    for rank in range(n):
        mine = 0x7F10_0000_0000 + rank * 0x1000  # each process has its own addresses
        entries = [pg(mine) if p == rank // 2 else "-100" for p in range(n // 2)]
        locs = [LocalVar(name="rank", repr=str(rank)), LocalVar(name="step", repr="2")]
        if table:
            locs += [
                LocalVar(name="pairs", repr=f"[{', '.join(entries)}]"),
                LocalVar(name="mine", repr=pg(mine)),
            ]
        if rank_lists:
            locs.append(LocalVar(name="pair_ranks", repr=f"[{rank // 2 * 2}, {rank // 2 * 2 + 1}]"))
        user = Frame(function="main", file=TRAIN, line=22 if rank == partner else 24, locals=locs)
        if rank == partner:
            frames = c10d("all_reduce", pg(mine), pg(mine))
        else:
            frames = c10d("barrier", pg(WORLD + rank), None)
        stacks.append(rank_stack(rank, [*frames, user, Frame(function="<module>", file=TRAIN, line=28)]))
    return stacks


def test_group_table_reads_members_and_non_members() -> None:
    assert group_table(f"[{pg(0xA)}, -100]") == ["0xa", None]
    assert group_table(f'{{"dp": -100, "tp": {pg(0xB)}}}') == [None, "0xb"]
    assert group_table(f"({pg(0xA)}, {pg(0xB)})") == ["0xa", "0xb"]
    for not_a_table in (
        "[-100, -100]",
        f"[{pg(0xA)}]",
        f"[{pg(0xA)}, 3]",
        "[<Tensor at 0x1>, -100]",
        None,
        "7",
    ):
        assert group_table(not_a_table) is None


@pytest.mark.parametrize(
    ("text", "rank", "world", "ranks"),
    [
        ("[2, 3]", 2, 4, [2, 3]),
        ("(3, 2)", 3, 4, [2, 3]),
        ("[[0, 1], [2, 3]]", 3, 4, [2, 3]),
        ("[0, 1]", 2, 4, None),  # does not hold the rank
        ("[0, 1, 2, 3]", 2, 4, None),  # the world
        ("[2, 9]", 2, 4, None),  # not ranks of this world
        ("[2, 2]", 2, 4, None),
        ("[[0, 2], [2, 3]]", 2, 4, None),  # the rank in two lists: which one is not said
        ("[2]", 2, 4, None),
    ],
)
def test_rank_list(text: str, rank: int, world: int, ranks: list[int] | None) -> None:
    assert rank_list(text, rank, world) == ranks


def test_read_group_locals_names_the_entry_of_the_waited_group() -> None:
    partner = pairs_job()[2]
    frames = partner.threads[0].frames
    assert waited_group(frames) == f"{0x7F10_0000_0000 + 2 * 0x1000:#x}"
    read = read_group_locals(frames, 2, 4)
    assert read is not None
    assert read.slot == "train.py:main:pairs[1]"
    assert read.tables == {"train.py:main:pairs": [False, True]}
    # torch's own frames never give a table or a rank list
    assert read_group_locals(frames[:2], 2, 4) is None


def test_rank_left_in_a_subgroup_names_the_member_that_went_on() -> None:
    report = analyze(Job(job_id="j", world_size=4), pairs_job(), [])
    v = report.verdict
    assert v.kind == "mismatched_collectives"
    assert v.suspect_ranks == [3] and v.confidence == "high"
    assert "rank 3, of rank 2's group, has gone on to barrier" in v.summary
    assert "entry 1 of `pairs` in main (train.py): ranks 2-3 hold a ProcessGroup" in v.evidence[0]
    assert v.next_steps[0].tool is None and "rank 3" in v.next_steps[0].action


def test_eight_ranks_with_a_rank_list_name_the_partner_at_medium_confidence() -> None:
    stacks = pairs_job(skipper=4, table=False, rank_lists=True, n=8)
    v = analyze(Job(job_id="j", world_size=8), stacks, []).verdict
    assert v.suspect_ranks == [4] and v.confidence == "medium"
    assert "rank 5's group is [4, 5], read from `pair_ranks` in main (train.py)" in v.evidence[0]


def test_a_table_missing_on_one_rank_decides_nothing() -> None:
    stacks = pairs_job()
    frames = stacks[0].threads[0].frames
    stripped = [
        *frames[:2],
        frames[2].model_copy(update={"locals": [LocalVar(name="rank", repr="0")]}),
        frames[3],
    ]
    stacks[0] = rank_stack(0, stripped)
    v = analyze(Job(job_id="j", world_size=4), stacks, []).verdict
    assert v.suspect_ranks == [] and v.confidence == "low"
    assert "name no culprit" in v.summary


def test_without_locals_the_flight_recorder_names_the_culprit() -> None:
    bare = [
        s.model_copy(
            update={
                "threads": [
                    t.model_copy(update={"frames": [f.model_copy(update={"locals": None}) for f in t.frames]})
                    for t in s.threads
                ],
                "subgroup": s.rank == 2,
            }
        )
        for s in pairs_job()
    ]
    v = analyze(Job(job_id="j", world_size=4), bare, []).verdict
    assert v.suspect_ranks == [] and v.confidence == "low"
    flight = FlightReport(
        verdict=Verdict(
            kind="divergent_ranks",
            summary="pg 1 (ranks 2,3) seq 3 all_reduce: rank 3 never issued it",
            suspect_ranks=[3],
            confidence="high",
            evidence=["rank 3: last enqueued seq 2 on pg 1"],
        )
    )
    v = analyze(Job(job_id="j", world_size=4), bare, [], flight).verdict
    assert v.suspect_ranks == [3] and v.confidence == "high"
    assert "flight recorder: pg 1 (ranks 2,3)" in v.summary
    assert v.evidence[0] == "flight recorder: rank 3: last enqueued seq 2 on pg 1"


def test_only_locals_named_for_ranks_or_groups_are_read_as_rank_lists() -> None:
    def read(name: str) -> list[int] | None:
        frame = Frame(function="main", file=TRAIN, line=3, locals=[LocalVar(name=name, repr="[1, 2]")])
        got = read_group_locals([frame], 1, 4)
        return got.ranks if got is not None else None

    for name in ("pair_ranks", "ranks", "group", "tp_members", "dp_group_ranks", "peers", "pg"):
        assert read(name) == [1, 2], name
    for name in ("upgrades", "shape", "dims", "page", "ranking_scores", "x"):
        assert read(name) is None, name


def test_a_list_of_each_ranks_own_groups_is_not_a_membership_table() -> None:
    """``mesh.get_all_groups()`` on a 2x2 mesh: every rank holds a ProcessGroup per dimension, and
    entry 0 is a different group on ranks 0 and 1. Nothing in it says who is not a member."""
    stacks = pairs_job()
    own = []
    for s in stacks:
        frames = s.threads[0].frames
        user = frames[2]
        mine = next(v.repr for v in user.locals or [] if v.name == "mine")
        locs = [v for v in user.locals or [] if v.name not in ("pairs", "mine")]
        locs.append(LocalVar(name="dims", repr=f"[{mine}, {pg(0x7F20_0000_0000 + (s.rank or 0))}]"))
        own.append(
            rank_stack(s.rank or 0, [*frames[:2], user.model_copy(update={"locals": locs}), frames[3]])
        )
    v = analyze(Job(job_id="j", world_size=4), own, []).verdict
    assert v.suspect_ranks == [] and v.confidence == "low"


def test_two_different_rank_lists_do_not_say_which_group_the_call_runs_on() -> None:
    frame = Frame(
        function="main",
        file=TRAIN,
        line=3,
        locals=[LocalVar(name="tp_ranks", repr="[2, 3]"), LocalVar(name="dp_ranks", repr="[0, 2]")],
    )
    assert read_group_locals([frame], 2, 4) is None
    same = frame.model_copy(
        update={"locals": [LocalVar(name="pair_ranks", repr="[2, 3]"), LocalVar(name="group", repr="(3, 2)")]}
    )
    read = read_group_locals([same], 2, 4)
    assert read is not None and read.ranks == [2, 3] and read.ranks_from == "train.py:main:pair_ranks"
