"""Why and since when ranks differ: a gradual-unfreeze job on 2 gloo ranks (tests/programs/probe_unfreeze.py).

Its gradient averager captured its parameter list before the backbone was unfrozen at step 6: the
grads check names the backbone's gradients as not averaged across ranks, and the watch (every 2 steps)
finds the first divergence at step 6, after a consistent check at step 4, and then stops checking.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_probe_jobs import finished_job, same_everywhere

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def unfreeze(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_job(tmp_path_factory, "probe_unfreeze.py", 2)


def test_grads_check_names_the_backbone_as_not_averaged(unfreeze: Path) -> None:
    got = same_everywhere(unfreeze, "grads", 2)
    rep = got["report"]
    by = {d["name"]: d for d in rep["divergent"]}
    assert sorted(by) == ["backbone.0.bias", "backbone.0.weight", "backbone.2.bias", "backbone.2.weight"]
    assert {d["reason"] for d in by.values()} == {"not_averaged"}
    assert rep["consistent_modules"] == ["head"]
    text = got["text"]
    assert len(text.encode()) <= 1500
    assert (
        "backbone.0 (rank 1 vs rank 0: grads not averaged across ranks): backbone.0.weight, backbone.0.bias"
        in text
    )
    assert "were not averaged across ranks" in text and "parameter list is captured once" in text


def test_watch_finds_the_first_divergent_step_then_stops(unfreeze: Path) -> None:
    got = same_everywhere(unfreeze, "watch", 2)
    assert got["first_divergent_step"] == 6 and got["last_consistent_step"] == 4
    assert got["checks"] == 4  # steps 0, 2, 4, 6: none after the divergence
    assert got["divergent"][0] == "backbone.0.weight" and "head.weight" not in got["divergent"]
    assert got["text"].startswith(
        "consistency watch (params): first divergence at step 6; last consistent check: step 4"
    )
