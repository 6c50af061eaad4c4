"""The cause `rankscope compare` leads with, on torch.save'd state written by a script, and what it says with nothing saved."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from mcp import Client

from rankscope.analysis.consistency_cause import stale_causes
from rankscope.capabilities.consistency import compare_dir
from rankscope.cli import main
from rankscope.errors import NothingToRead
from rankscope.mcp_server import build_server
from tests.paths import DATA


def trained(steps: int, width: int = 8, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def save_ranks(
    folder: Path, states: list[tuple[torch.nn.Module, torch.optim.Optimizer]], layout: str
) -> Path:
    """One rank per state: ``one`` file per rank, ``two`` (model_rank<R>.pt, optim_rank<R>.pt), ``dirs`` (rank<R>/)."""
    folder.mkdir(parents=True)
    for rank, (model, opt) in enumerate(states):
        if layout == "one":
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, folder / f"rank{rank}.pt")
        elif layout == "two":
            torch.save(model.state_dict(), folder / f"model_rank{rank}.pt")
            torch.save(opt.state_dict(), folder / f"optim_rank{rank}.pt")
        else:
            (folder / f"rank{rank}").mkdir()
            torch.save(model.state_dict(), folder / f"rank{rank}" / "model.pt")
            torch.save(opt.state_dict(), folder / f"rank{rank}" / "optim.pt")
    return folder


@pytest.mark.parametrize(
    ("layout", "step"),
    [("one", "optim.state.0.step"), ("two", "optim.state.0.step"), ("dirs", "optim.state.0.step")],
)
def test_optimizer_state_behind_in_every_layout(tmp_path: Path, layout: str, step: str) -> None:
    new, old = trained(50), trained(30)
    report = compare_dir(str(save_ranks(tmp_path / "ckpt", [new, new, new, old], layout)))
    assert (
        report.causes[0]
        == f"rank 3's optimizer state is 20 steps behind the others' ({step} 30 vs 50 on ranks 0-2)"
    )
    names = {d.name for d in report.divergent}
    assert "model.0.weight" in names and "optim.state.0.exp_avg" in names  # one name per file pattern
    assert len(report.read) == (1 if layout == "one" else 2)


def test_a_model_of_another_shape(tmp_path: Path) -> None:
    states = [trained(5, width=16), trained(5), trained(5), trained(5)]
    report = compare_dir(str(save_ranks(tmp_path / "ckpt", states, "two")))
    assert report.causes[0].startswith("rank 0's file holds another model: ")
    assert "model.0.weight [16, 4] vs [8, 4] on ranks 1-3" in report.causes[0]


def test_a_key_some_ranks_lack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two ranks against two: no majority, so the line names the ranks that lack it."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    model, _ = trained(0)
    for rank in range(4):
        sd: dict[str, Any] = dict(model.state_dict())
        if rank in (1, 2):
            sd["head.weight"] = torch.ones(2)
        torch.save(sd, folder / f"model_rank{rank}.pt")
    assert main(["compare", str(folder)]) == 1
    assert (
        capsys.readouterr().out.splitlines()[0] == "ranks 0,3 lack 1 key(s) that ranks 1-2 have: head.weight"
    )


def test_every_tensor_of_another_run_with_nothing_else_to_tell(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for rank in range(3):
        torch.save(trained(0, seed=9 if rank == 2 else 0)[0].state_dict(), folder / f"model_rank{rank}.pt")
    report = compare_dir(str(folder))
    assert report.causes[0] == (
        "rank 2 differs from ranks 0-1 in every compared tensor (4 of 4): a file of another step or run"
    )
    assert "older state" in report.next_steps[0].action


def test_a_file_much_older_than_the_others(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    model, _ = trained(0)
    for rank in range(4):
        torch.save(model.state_dict(), folder / f"model_rank{rank}.pt")
    old = time.time() - 3 * 86400
    os.utime(folder / "model_rank1.pt", (old, old))
    report = compare_dir(str(folder))
    assert report.consistent  # the same bytes: the age alone says nothing is wrong
    assert report.causes[0].startswith("rank 1's model_rank1.pt was written 3.0 days before the others'")


def test_stale_causes_split_at_the_widest_gap() -> None:
    """Ranks that save together are seconds apart; one that did not is far behind; a slow save is no cause."""
    (cause,) = stale_causes({"rank{R}.pt": {0: 10_000.0, 1: 10_002.0, 2: 10_001.0, 3: 1_000.0}})
    assert cause.ranks == (3,) and cause.text.startswith(
        "rank 3's rank3.pt was written 2.5 h before the others'"
    )
    assert (
        stale_causes({"rank{R}.pt": {0: 0.0, 1: 30.0, 2: 50.0, 3: 95.0}}) == []
    )  # no rank apart: a slow save


def test_nothing_saved_says_what_to_add(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.log").write_text("step 1 loss 0.5\n")
    with pytest.raises(NothingToRead) as caught:
        compare_dir(str(tmp_path))
    assert "rankscope.probe.watch_consistency(model, every=50, optimizer=opt)" in caught.value.fix
    monkeypatch.chdir(tmp_path)  # `rankscope compare` with no folder reads the one it runs in
    assert main(["compare"]) == 2
    assert "watch_consistency" in capsys.readouterr().err


def test_the_one_checkpoint_folder_below_the_given_one_is_compared(tmp_path: Path) -> None:
    """The job's folder given (as a person knows it), its checkpoints one level down: one call answers."""
    new, old = trained(50), trained(30)
    save_ranks(tmp_path / "job" / "ckpt", [new, new, old, new], "one")
    (tmp_path / "job" / "train.py").write_text("print('hi')\n")
    report = compare_dir(str(tmp_path / "job"))
    assert report.causes and "rank 2" in report.causes[0]
    assert all(r.startswith("ckpt/") for r in report.read)


def test_per_rank_files_one_level_down_are_named(tmp_path: Path) -> None:
    model, opt = trained(1)
    save_ranks(tmp_path / "ckpt" / "step_100", [(model, opt)] * 2, "one")
    save_ranks(tmp_path / "ckpt" / "step_200", [(model, opt)] * 2, "one")
    with pytest.raises(NothingToRead, match=r"per-rank files are in its sub-folders: .*step_100") as caught:
        compare_dir(str(tmp_path / "ckpt"))
    assert (
        caught.value.fix
        == f"Compare one save at a time: `rankscope compare {tmp_path / 'ckpt' / 'step_200'}`."
    )


def test_a_dcp_checkpoint_is_sent_to_placements() -> None:
    with pytest.raises(NothingToRead, match="it is a DCP checkpoint") as caught:
        compare_dir(str(DATA / "probe" / "dcp_fsdp2"))
    assert caught.value.fix.startswith("`rankscope placements ")


def test_mcp_text_leads_with_the_cause(tmp_path: Path) -> None:
    new, old = trained(50), trained(30)
    folder = save_ranks(tmp_path / "ckpt", [new, new, old, new], "one")

    async def go() -> Any:
        async with Client(build_server()) as client:
            return await client.call_tool("check_tensor_consistency", {"path": str(folder)})

    result = anyio.run(go)
    text = result.content[0].text
    assert text.startswith("rank 2's optimizer state is 20 steps behind the others'"), text
    assert result.structured_content["causes"][0] == text.splitlines()[0]
    assert len(text.encode()) < 4000


def test_the_watch_it_names_is_one_line() -> None:
    """watch_consistency(..., optimizer=opt) checks after every optimizer step by itself."""
    from rankscope.probe import watch_consistency

    model, opt = trained(0)
    watch = watch_consistency(model, every=2, optimizer=opt, announce=False)
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    assert watch.checks == 2 and watch.last_consistent_step == 2 and not watch.stopped


def test_a_scheduler_behind_counts_steps(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for rank in range(3):
        sched = {"last_epoch": 700 if rank == 0 else 900, "base_lrs": [0.1]}
        torch.save({"scheduler": sched, "w": torch.ones(2)}, folder / f"state_rank{rank}.pt")
    assert compare_dir(str(folder)).causes[0] == (
        "rank 0's saved last_epoch is 200 steps behind the others' (scheduler.last_epoch 700 vs 900 on ranks 1-2)"
    )
