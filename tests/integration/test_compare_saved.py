"""`rankscope compare` on the files a real 4-rank DDP job (gloo, CPU) saved: the first line names the rank and the cause.

One job (tests/programs/save_rank_state.py) saves every rank's checkpoint at two steps, a run
resumed with its last rank on the older file, a save with a key only rank 2 has, and a run from
another seed; each case below is a folder of those files, as a job leaves them.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from rankscope.capabilities.consistency import compare_dir
from rankscope.cli import main
from tests.jobs import JobFactory

pytestmark = pytest.mark.slow
NPROC = 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("save_rank_state")
    jobs = JobFactory(tmp)
    try:
        job = jobs.torchrun("save_rank_state.py", nproc=NPROC, args=[str(tmp / "out")])
        job.wait_ready([f"done{r}" for r in range(NPROC)], timeout=150)
        assert job.wait_exit(60, "save_rank_state.py to exit once its ranks were done") == 0, job.output()
    finally:
        jobs.cleanup()
    return tmp / "out"


def mixed(saved: Path, dest: Path, odd_rank: int, odd_save: str, base: str = "step30") -> Path:
    """A folder of ``base``'s files, with ``odd_rank``'s taken from ``odd_save``."""
    dest.mkdir()
    for r in range(NPROC):
        shutil.copy2(saved / (odd_save if r == odd_rank else base) / f"rank{r}.pt", dest / f"rank{r}.pt")
    return dest


def first_line(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["compare", str(folder)]) == 1
    return capsys.readouterr().out.splitlines()[0]


def test_a_rank_resumed_from_an_older_file(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The job's own save after the resume: rank 3's optimizer is behind, and its weights drifted."""
    assert first_line(saved / "resumed", capsys) == (
        "rank 3's optimizer state is 10 steps behind the others' (optim.state.0.step 30 vs 40 on ranks 0-2)"
    )
    report = compare_dir(str(saved / "resumed"))
    drifted = {d.name: d.ranks for d in report.divergent}
    assert drifted["model.0.weight"] == [3] and drifted["step"] == [3]
    assert report.next_steps[0].skill_section == "skill/wrong-results.md#one-rank-behind-or-from-another-run"


def test_an_older_file_says_its_age(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = mixed(saved, tmp_path / "ckpt", 3, "step20")
    old = time.time() - 2 * 3600
    os.utime(folder / "rank3.pt", (old, old))
    line = first_line(folder, capsys)
    assert line.startswith(
        "rank 3's optimizer state is 10 steps behind the others' (optim.state.0.step 20 vs 30"
    )
    assert line.endswith("; rank3.pt was written 2.0 h before the others'")


def test_a_key_only_one_rank_has(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert first_line(saved / "ema", capsys) == (
        "rank 2 has 4 key(s) that ranks 0-1,3 lack: ema.0.weight, ema.0.bias, ema.2.weight and 1 more"
    )


def test_a_file_from_another_run(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = mixed(saved, tmp_path / "ckpt", 1, "other_run")
    assert first_line(folder, capsys) == (
        "rank 1's file comes from another run: its config.seed differs from ranks 0,2-3' (1234 vs 0)"
    )
    report = compare_dir(str(folder))
    assert {d.name: d.ranks for d in report.divergent}["model.0.weight"] == [1]


def test_one_save_of_one_run_agrees(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(saved / "step30")]) == 0
    assert capsys.readouterr().out.startswith(
        "CONSISTENT: all 35 compared tensors are identical across ranks 0-3"
    )
    assert compare_dir(str(saved / "step30")).per_rank == ["rng"]  # each rank's own generator: no difference
