"""Collapsing per-rank output: identical lines once, differing lines stand out, in rank order."""

from __future__ import annotations

import json

from rankscope.analysis.collapse import collapse_rank_lines, format_ranks, rank_label, render_collapsed
from rankscope.models.run import CollapsedLine
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "run"


def _captured(name: str, stream: str) -> dict[int, list[str]]:
    raw = json.loads((DATA / name).read_text())[f"lines_by_rank_{stream}"]
    return {int(rank): lines for rank, lines in raw.items()}


def test_format_ranks_compacts_runs() -> None:
    assert format_ranks([0, 1, 2, 4]) == "0-2,4"
    assert format_ranks([5, 1, 2, 2]) == "1-2,5"
    assert format_ranks([3]) == "3"
    assert format_ranks([]) == ""
    assert format_ranks(range(8)) == "0-7"
    assert rank_label([3]) == "rank 3"
    assert rank_label([0, 1, 3]) == "ranks 0-1,3"


def test_identical_output_collapses_to_uniform_lines() -> None:
    lines = ["step 0 loss 1.23", "step 1 loss 1.10", "done"]
    out = collapse_rank_lines({r: list(lines) for r in range(4)})
    assert out == [CollapsedLine(ranks=[0, 1, 2, 3], text=t, uniform=True) for t in lines]
    assert render_collapsed(out)[0] == "  ranks 0-3: step 0 loss 1.23"


def test_a_differing_line_stands_out_in_rank_order() -> None:
    by_rank = {r: ["start", "loss 1.0", "done"] for r in range(4)}
    by_rank[2] = ["start", "loss nan", "done"]
    out = collapse_rank_lines(by_rank)
    assert [(c.ranks, c.text, c.uniform) for c in out] == [
        ([0, 1, 2, 3], "start", True),
        ([0, 1, 3], "loss 1.0", False),
        ([2], "loss nan", False),
        ([0, 1, 2, 3], "done", True),
    ]
    assert render_collapsed(out)[2] == "! rank 2: loss nan"


def test_ranks_that_differ_the_same_way_are_grouped() -> None:
    by_rank = {0: ["a", "x=1"], 1: ["a", "x=2"], 2: ["a", "x=1"], 3: ["a", "x=2"]}
    out = collapse_rank_lines(by_rank)
    assert [(c.ranks, c.text) for c in out] == [([0, 1, 2, 3], "a"), ([0, 2], "x=1"), ([1, 3], "x=2")]


def test_an_extra_line_on_one_rank_does_not_shift_the_rest() -> None:
    common = [f"step {i}" for i in range(5)]
    by_rank = {0: list(common), 1: [*common[:2], "warning: slow batch", *common[2:]], 2: list(common)}
    out = collapse_rank_lines(by_rank)
    uniform = [c.text for c in out if c.uniform]
    assert uniform == common  # a positional alignment would call steps 2-4 divergent
    assert CollapsedLine(ranks=[1], text="warning: slow batch", uniform=False) in out
    assert [c.text for c in out].index("warning: slow batch") == 2


def test_missing_and_trailing_lines() -> None:
    out = collapse_rank_lines({0: ["a", "b"], 1: ["a"], 2: ["a", "b", "c"], 3: []})
    assert [(c.ranks, c.text, c.uniform) for c in out] == [
        ([0, 1, 2], "a", False),
        ([0, 2], "b", False),
        ([2], "c", False),
    ]
    assert collapse_rank_lines({}) == []
    assert collapse_rank_lines({5: ["only"]}) == [CollapsedLine(ranks=[5], text="only", uniform=True)]


def test_captured_crash_output() -> None:
    """Real 3-rank run: rank 1 exited; ranks 0 and 2 print the same traceback but different peer ports."""
    out = collapse_rank_lines(_captured("crash_3ranks.json", "stderr"))
    tb = [c for c in out if c.text == "Traceback (most recent call last):"]
    assert len(tb) == 1 and tb[0].ranks == [0, 2] and not tb[0].uniform
    errors = [c for c in out if c.text.startswith("RuntimeError")]
    assert [c.ranks for c in errors] == [[0], [2]]  # the port differs: one line per rank
    assert all("Connection closed by peer" in c.text for c in errors)
    stdout = collapse_rank_lines(_captured("crash_3ranks.json", "stdout"))
    assert [c.ranks for c in stdout] == [[0], [1], [2]]


def test_collapse_scales_to_many_ranks() -> None:
    lines = [f"step {i} loss {1.0 / (i + 1):.4f}" for i in range(200)]
    by_rank = {r: list(lines) for r in range(64)}
    by_rank[17] = [*lines[:100], "loss nan", *lines[101:]]
    out = collapse_rank_lines(by_rank)
    assert len(out) == 201
    assert CollapsedLine(ranks=[17], text="loss nan", uniform=False) in out
    assert out[100].ranks == [r for r in range(64) if r != 17]


def test_repeated_lines_stay_aligned_and_long_divergence_falls_back_to_positions() -> None:
    dots = ["."] * 3000
    by_rank = {0: list(dots), 1: [*dots[:1500], "stall", *dots[1501:]], 2: list(dots)}
    out = collapse_rank_lines(by_rank)
    assert len(out) == 3001
    assert CollapsedLine(ranks=[1], text="stall", uniform=False) in out
    assert sum(c.uniform for c in out) == 2999
    # two long, entirely different outputs: paired line by line instead of a quadratic alignment
    a = [f"a{i % 7}" for i in range(1000)]
    b = [f"b{i % 5}" for i in range(1200)]
    out = collapse_rank_lines({0: a, 1: b})
    assert [c.text for c in out[:2]] == ["a0", "b0"]
    assert sorted(c.text for c in out) == sorted(a + b)
