"""rankscope.probe inside real multi-rank gloo jobs on CPU.

Two jobs cover every scenario (each torchrun start costs seconds on this
machine): tests/programs/probe_divergence.py on 3 ranks and
tests/programs/probe_sharded.py on 4 ranks; both write one JSON report per
case and rank into a directory, read here after the job exits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from rankscope.capabilities.consistency import compare_dir
from rankscope.capabilities.placements import inspect_placements
from tests.jobs import JobFactory

pytestmark = pytest.mark.slow


def run_job(jobs: JobFactory, program: str, nproc: int, out: Path) -> None:
    job = jobs.torchrun(program, nproc=nproc, args=[str(out)])
    job.wait_ready([f"done{r}" for r in range(nproc)], timeout=150)
    assert job.wait_exit(60, f"{program} to exit once its ranks were done") == 0, job.output()


def reports(out: Path, case: str, nproc: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"{case}-rank{r}.json").read_text()) for r in range(nproc)]


def same_everywhere(out: Path, case: str, nproc: int) -> dict[str, Any]:
    all_ranks = reports(out, case, nproc)
    assert all(r == all_ranks[0] for r in all_ranks), f"{case}: report differs between ranks"
    return all_ranks[0]


def finished_job(tmp_path_factory: pytest.TempPathFactory, program: str, nproc: int) -> Path:
    """Run ``program`` on ``nproc`` ranks to completion; the directory of what its ranks saved."""
    tmp = tmp_path_factory.mktemp(program.removesuffix(".py"))
    factory = JobFactory(tmp)
    try:
        run_job(factory, program, nproc, tmp / "out")
    finally:
        factory.cleanup()
    return tmp / "out"


@pytest.fixture(scope="module")
def divergence(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_job(tmp_path_factory, "probe_divergence.py", 3)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_job(tmp_path_factory, "probe_sharded.py", 4)


def test_probe_without_init_process_group_acts_locally(divergence: Path) -> None:
    local = reports(divergence, "local", 3)[0]
    assert local["consistent"] and local["ranks"] == [0] and local["world_size"] == 1
    assert "not initialised" in local["notes"][0]


def test_print_all_ranks_collapses_identical_lines(divergence: Path) -> None:
    lines = same_everywhere(divergence, "print", 3)
    assert lines == ["  ranks 0-2: world 3", "! ranks 0-1: loss 1.25", "! rank 2: loss nan"]


def test_missing_broadcast_every_param_divergent_on_the_odd_rank(divergence: Path) -> None:
    rep = same_everywhere(divergence, "nobcast", 3)
    assert not rep["consistent"]
    assert [d["name"] for d in rep["divergent"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert all(d["ranks"] == [2] and d["reference_ranks"] == [0, 1] for d in rep["divergent"])
    # second phase: max |diff| measured on the odd rank only
    diffs = [v["max_abs_diff"] for d in rep["divergent"] for v in d["values"] if v["rank"] == 2]
    assert len(diffs) == 4 and all(x is not None and x > 0 for x in diffs)
    assert same_everywhere(divergence, "bcast", 3)["consistent"]


def test_batchnorm_without_syncbn_flags_only_running_stats(divergence: Path) -> None:
    rep = same_everywhere(divergence, "bn", 3)
    assert [d["name"] for d in rep["divergent"]] == ["1.running_mean", "1.running_var"]
    assert rep["next_steps"][0]["skill_section"] == "skill/wrong-results.md#batchnorm"


def test_nan_on_one_rank(divergence: Path) -> None:
    rep = same_everywhere(divergence, "nan", 3)
    assert rep["nonfinite"] == [{"name": "activations", "rank": 1, "nan": 1, "inf": 0}]
    assert [(d["name"], d["ranks"], d["reason"]) for d in rep["divergent"]] == [
        ("activations", [1], "nonfinite")
    ]


def test_unused_parameter_on_one_rank(divergence: Path) -> None:
    rep = same_everywhere(divergence, "unused", 3)
    by = {d["name"]: d for d in rep["divergent"]}
    assert by["head_b.weight"]["ranks"] == [1] and by["head_b.weight"]["reason"] == "no_grad"
    assert "head_a.weight" not in by


def test_keys_on_some_ranks_and_bad_input(divergence: Path) -> None:
    rep = same_everywhere(divergence, "keys", 3)
    assert rep["missing_keys"] == [{"name": "extra", "present_on": [0], "missing_on": [1, 2]}]
    err = reports(divergence, "badinput", 3)[0]["error"]
    assert "cannot fingerprint an object of type int" in err and "Fix:" in err


def test_a_rank_that_skips_the_probe_times_out_the_others(divergence: Path) -> None:
    for r in (0, 1):
        err = json.loads((divergence / f"timeout-rank{r}.json").read_text())["error"]
        assert "Timed out" in err and "Every rank of the group must call the same probe" in err
    assert not (divergence / "timeout-rank2.json").exists()


def test_dumped_fingerprints_and_saved_state_dicts_compare_offline(divergence: Path) -> None:
    for sub in ("fp", "sd"):
        rep = compare_dir(str(divergence / sub))
        assert [d.ranks for d in rep.divergent] == [[2]] * 4, sub
    fp = json.loads((divergence / "fp" / "fingerprints-rank1.json").read_text())
    assert fp["world_size"] == 3 and fp["job_id"].startswith("127.0.0.1:")


def test_fsdp2_placements_and_consistency(sharded: Path) -> None:
    place = reports(sharded, "fsdp_place", 4)[1]
    assert {w["fqn"]: w["wrapping"] for w in place["wrapping"]} == {
        "": "fsdp2",
        "blocks.0": "fsdp2",
        "blocks.1": "fsdp2",
    }
    w = {t["fqn"]: t for t in place["tensors"]}["blocks.0.fc1.weight"]
    assert (
        w["placements"] == ["Shard(dim=0)"] and w["global_shape"] == [32, 16] and w["local_shape"] == [8, 16]
    )
    assert place["coverage"]["sharded_share"] == 1.0 and place["coverage"]["warnings"] == []
    root_only = reports(sharded, "rootonly_place", 4)[0]["coverage"]
    assert any("root only all-gathers the whole model" in x for x in root_only["warnings"])
    cons = same_everywhere(sharded, "fsdp_cons", 4)
    assert (
        cons["consistent"] and cons["compared"] == 0 and cons["sharded_not_compared"] == 20
    )  # 10 params + 10 grads


def test_2d_mesh_dtensor_consistency_compares_only_replicas(sharded: Path) -> None:
    place = reports(sharded, "tp_place", 4)[3]
    col = {t["fqn"]: t for t in place["tensors"]}["colwise"]
    assert col["mesh_shape"] == [2, 2] and col["mesh_dim_names"] == ["dp", "tp"]
    assert col["placements"] == ["Replicate()", "Shard(dim=0)"] and col["local_shape"] == [4, 4]
    assert same_everywhere(sharded, "tp_cons", 4)["consistent"]
    bad = same_everywhere(sharded, "tp_cons_bad", 4)
    assert [(d["name"], d["ranks"], d["replica_group"], d["shard_key"]) for d in bad["divergent"]] == [
        ("colwise", [3], [1, 3], "tp=1")
    ]
    assert [v["max_abs_diff"] for v in bad["divergent"][0]["values"]] == [None, 1.0]
    assert bad["partial"] == ["pending"]


def test_subgroups_compare_and_print_on_their_own(sharded: Path) -> None:
    subgroup = reports(sharded, "subgroup", 4)
    assert [(r["ranks"], r["consistent"]) for r in subgroup] == [([0, 1], True)] * 2 + [([2, 3], True)] * 2
    printed = reports(sharded, "subgroup_print", 4)
    assert printed[0] == printed[1] == ["  ranks 0-1: dp 0"]
    assert printed[2] == printed[3] == ["  ranks 2-3: dp 1"]


def test_dcp_checkpoint_written_by_fsdp2(sharded: Path) -> None:
    rep = inspect_placements(str(sharded / "dcp"))
    assert rep.problems == [] and rep.sharded == 10 and rep.whole == 1 and rep.objects == ["step"]
    assert len(rep.files) == 4
    offline = inspect_placements(str(sharded / "placements"))
    assert offline.problems == [] and offline.coverage is not None


def test_import_probe_is_cheap() -> None:
    import subprocess

    code = "import sys, rankscope.probe; print('torch' in sys.modules, 'mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr
