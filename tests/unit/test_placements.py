"""Placement math and the offline inspector (`rankscope placements`).

The pure tests; the ones that start processes are in tests/integration/test_placements.py.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from rankscope.analysis.placements import coverage, tiling_problems
from rankscope.capabilities.placements import inspect_placements
from rankscope.cli import main
from rankscope.errors import InvalidInput
from rankscope.models.placements import Chunk, ModuleWrapping, PlacementReport, TensorPlacement
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "probe"


def c(offsets: list[int], sizes: list[int]) -> Chunk:
    return Chunk(offsets=offsets, sizes=sizes)


def load(name: str) -> PlacementReport:
    return PlacementReport.model_validate(json.loads((DATA / name).read_text()))


def tampered(tmp_path: Path) -> Path:
    """A copy of the checkpoint whose metadata says two chunks overlap, and with one storage file gone."""
    import torch

    dst = tmp_path / "ckpt"
    shutil.copytree(DATA / "dcp_fsdp2", dst)
    md = pickle.loads((dst / ".metadata").read_bytes())
    meta = md.state_dict_metadata["blocks.0.fc1.weight"]
    meta.chunks[1].offsets = torch.Size([4, 0])
    (dst / ".metadata").write_bytes(pickle.dumps(md))
    (dst / "__3_0.distcp").unlink()
    return dst


def test_tiling_exact_gap_overlap_bounds_and_replicas() -> None:
    assert tiling_problems("w", [4, 2], [c([0, 0], [2, 2]), c([2, 0], [2, 2])]) == []
    assert "cover 4 of 8" in tiling_problems("w", [4, 2], [c([0, 0], [2, 2])])[0]
    assert "overlap" in tiling_problems("w", [4, 2], [c([0, 0], [3, 2]), c([2, 0], [2, 2])])[0]
    assert "outside" in tiling_problems("w", [4, 2], [c([0, 0], [2, 2]), c([3, 0], [2, 2])])[0]
    dup = [c([0, 0], [2, 2]), c([0, 0], [2, 2]), c([2, 0], [2, 2])]
    assert tiling_problems("w", [4, 2], dup, replicas_allowed=True) == []
    assert "overlap" in tiling_problems("w", [4, 2], dup)[0]
    # FSDP2 pads uneven shards: an empty chunk on the last rank is fine.
    assert tiling_problems("b", [3], [c([0], [1]), c([1], [1]), c([2], [1]), c([3], [0])]) == []


def test_root_only_fully_shard_is_called_out() -> None:
    rep = load("rootonly_placement-rank0.json")
    again = coverage(
        rep.tensors,
        rep.wrapping,
        [("", False), ("blocks", True), ("blocks.0", False), ("blocks.1", False), ("head", False)],
    )
    assert again.fsdp_units == [""]
    assert again.sharded_share == 1.0
    assert [m.name for m in again.modules_not_own_unit] == ["blocks.0", "blocks.1", "head"]
    assert any("root only all-gathers the whole model" in w for w in again.warnings)
    assert rep.coverage.warnings == again.warnings  # what the probe computed in the job


def test_per_block_fsdp_has_no_warning_and_estimates_per_rank_bytes() -> None:
    rep = load("fsdp_placements/placements-rank1.json")
    cov = rep.coverage
    assert cov.fsdp_units == ["", "blocks.0", "blocks.1"]
    assert cov.warnings == [] and cov.modules_not_own_unit == []
    params = [t for t in rep.tensors if t.kind == "param"]
    assert cov.est_param_bytes_per_rank == sum(t.local_bytes for t in params) < cov.param_bytes
    assert cov.est_adam_state_bytes_per_rank == 2 * cov.est_param_bytes_per_rank  # fp32 params: 2 x 4 bytes


def test_plain_params_next_to_sharded_ones_are_warned_about() -> None:
    rep = load("tp_placement-rank3.json")
    plain = TensorPlacement(
        fqn="lm_head.weight",
        global_shape=[100, 4],
        local_shape=[100, 4],
        dtype="float32",
        local_bytes=1600,
        global_bytes=1600,
    )
    cov = coverage([*rep.tensors, plain], [ModuleWrapping(fqn="", cls="X", wrapping="fsdp2")])
    assert cov.largest_unsharded[0].name == "lm_head.weight"
    assert any("plain tensors" in w for w in cov.warnings)


def test_tp_placement_report_from_a_2d_mesh() -> None:
    rep = load("tp_placement-rank3.json")
    by = {t.fqn: t for t in rep.tensors}
    assert by["colwise"].mesh_shape == [2, 2] and by["colwise"].mesh_dim_names == ["dp", "tp"]
    assert by["colwise"].placements == ["Replicate()", "Shard(dim=0)"] and by["colwise"].global_offset == [
        4,
        0,
    ]
    assert by["rowwise"].local_shape == [4, 4] and by["rowwise"].global_offset == [0, 4]
    assert by["bias"].layout == "replicated"


def test_inspect_real_fsdp2_dcp_checkpoint() -> None:
    report = inspect_placements(str(DATA / "dcp_fsdp2"))
    assert report.source == "dcp" and report.problems == []
    by = {t.fqn: t for t in report.tensors}
    w = by["blocks.0.fc1.weight"]
    assert w.layout == "sharded" and w.global_shape == [32, 16] and w.dtype == "float32"
    assert [ch.offsets for ch in w.chunks] == [[0, 0], [8, 0], [16, 0], [24, 0]]
    assert {ch.file for ch in w.chunks} == {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"}
    assert [f.file for f in report.files] == sorted(p.name for p in (DATA / "dcp_fsdp2").glob("*.distcp"))
    assert report.sharded == 10 and report.whole == 1 and report.objects == ["step"]
    scale = by["scale"]  # a plain tensor every rank holds: stored once, whole
    assert scale.layout == "whole" and len(scale.chunks) == 1 and scale.chunks[0].sizes == [3]
    tensor_bytes = sum(ch.bytes or 0 for t in report.tensors for ch in t.chunks)
    assert 0 < tensor_bytes < sum(f.bytes for f in report.files)  # the files also hold the "step" object


def test_overlap_gap_and_missing_file_are_problems(tmp_path: Path) -> None:
    report = inspect_placements(str(tampered(tmp_path)))
    joined = "\n".join(report.problems)
    assert "blocks.0.fc1.weight: chunks at offsets [0, 0] and [4, 0] overlap" in joined
    assert "storage file __3_0.distcp is referenced by .metadata but missing" in joined


def test_bad_paths_are_errors_with_a_fix(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as exc:
        inspect_placements(str(tmp_path))
    assert "neither a DCP checkpoint" in exc.value.message and exc.value.fix
    with pytest.raises(InvalidInput):
        inspect_placements(str(tmp_path / "nope"))
    (tmp_path / ".metadata").write_bytes(b"truncated")
    with pytest.raises(InvalidInput) as exc:
        inspect_placements(str(tmp_path))
    assert "cannot read" in exc.value.message and "finished writing" in exc.value.fix


def test_cli_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["placements", str(DATA / "dcp_fsdp2"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tensors"][0]["layout"] == "sharded" and data["problems"] == []
    assert {"fqn", "layout", "global_shape", "chunks"} <= set(data["tensors"][0])
    assert main(["placements", str(DATA / "rootonly_placement-rank0.json")]) == 0
    assert "warning: one FSDP unit (the root)" in capsys.readouterr().out
    assert main(["placements", "/nonexistent"]) == 2
    assert "Fix:" in capsys.readouterr().err
