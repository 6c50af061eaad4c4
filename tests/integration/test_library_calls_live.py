"""A library call that is itself a collective, made on rank 0 alone, on live 3-rank gloo jobs: rank
0 against a majority of two waiting in the next all_reduce (with one other rank the split would be
even, which another rule judges).

One program (tests/programs/hang_libcall.py) with a mode per library: ZeRO's
consolidate_state_dict, FSDP2's full state dict, DCP's save, and an installed metrics package's
compute(). The four jobs start together, so their ranks import torch at once instead of one job
after another; each is then read with ``rankscope stacks``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs import PROGRAMS, JobFactory, wait_for
from tests.live_stacks import READY_S, run_cli

pytestmark = pytest.mark.slow

MODES: dict[str, str] = {
    "zero": "ZeroRedundancyOptimizer.consolidate_state_dict",
    "fsdp2": "get_model_state_dict",
    "dcp": "torch.distributed.checkpoint.save",
    "metrics": "Accuracy.compute",
}


def _install_trainlib(tmp_path: Path) -> Path:
    """trainlib (its metrics module included) pip-installed into a site-packages folder, as a real package is."""
    site = tmp_path / "site-packages"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(PROGRAMS / "trainlib_pkg")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    return site


def _verdict_naming_rank_0(pid: int, mode: str) -> dict[str, object]:
    """``rankscope stacks --json``'s verdict, read until it names rank 0 (ranks may still be on their way)."""
    box: list[dict[str, object]] = []

    def named() -> bool:
        code, out, err = run_cli("stacks", "--pid", str(pid), "--json")
        assert code == 0, err
        box[:] = [json.loads(out)["verdict"]]
        return box[0].get("suspect_ranks") == [0]

    try:
        wait_for(named, 90, f"rank 0 named in {mode}", interval=0.5)
    except TimeoutError:
        raise AssertionError(f"{mode}: {box}") from None
    return box[0]


def test_a_library_collective_called_on_rank_0_alone_is_named(
    jobs: JobFactory, pyspy_works: str, tmp_path: Path
) -> None:
    site = _install_trainlib(tmp_path)
    env = {"PYTHONPATH": f"{site}{os.pathsep}{PROGRAMS}"}
    started = {
        mode: jobs.torchrun("hang_libcall.py", nproc=3, args=["--mode", mode], env=env) for mode in MODES
    }
    for mode, job in started.items():
        job.wait_ready(timeout=READY_S)
        v = _verdict_naming_rank_0(job.pid, mode)
        summary = str(v["summary"])
        assert v["kind"] == "mismatched_collectives" and v["confidence"] == "high", (mode, v)
        assert summary.startswith(f"rank 0 alone called {MODES[mode]} (hang_libcall.py:"), (mode, summary)
        assert "guards the call" in summary and "subgroup" not in summary, (mode, summary)
