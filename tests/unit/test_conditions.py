"""The condition above a collective's call site, read from the source lines the shell supplies."""

from __future__ import annotations

from rankscope.analysis.conditions import guard_of
from rankscope.models.core import CallSite

TRAIN = "/job/train.py"


def src(text: str) -> dict[tuple[str, int], str]:
    return {(TRAIN, i): line for i, line in enumerate(text.splitlines(), 1)}


def site(line: int) -> CallSite:
    return CallSite(file=TRAIN, line=line, function="main")


CODE = """\
def main():
    for step in range(10):
        loss = model(x)
        if dist.get_rank() == 0:
            dist.barrier()
        if torch.isfinite(loss):
            loss.backward()
            dist.all_reduce(grad)
        if step % 10 == 0:
            dist.all_reduce(metric)
        else:
            if is_main_process():
                pass
            else:
                dist.broadcast(t, 0)
        dist.all_reduce(t)
"""


def test_rank_condition_is_quoted() -> None:
    g = guard_of(site(5), src(CODE))
    assert g is not None and g.kind == "rank" and g.line == 4 and g.text == "if dist.get_rank() == 0:"
    assert (
        g.phrase("train.py", "barrier", 5)
        == "train.py:4 `if dist.get_rank() == 0:` guards the barrier at train.py:5"
    )


def test_data_condition_is_found_through_other_statements() -> None:
    g = guard_of(site(8), src(CODE))
    assert g is not None and g.kind == "data" and g.line == 6


def test_else_branch_is_followed_to_its_if() -> None:
    g = guard_of(site(15), src(CODE))
    assert g is not None and g.kind == "rank" and g.line == 12


def test_no_guard_for_a_plain_call_or_an_unrelated_condition() -> None:
    assert guard_of(site(16), src(CODE)) is None  # only the for loop encloses it
    assert guard_of(site(10), src(CODE)) is None  # step % 10 says nothing about ranks or data
    assert guard_of(site(5), {}) is None  # source not readable
    assert guard_of(None, src(CODE)) is None
