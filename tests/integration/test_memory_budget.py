"""The budget against numbers worked out by hand for a real FSDP2 model on CPU.

Net: emb [100,16], three blocks of lin1 [64,16]+[64] and lin2 [16,64]+[16],
head [11,16]; fully_shard on each block and at the root, world size 2.

Elements, global: emb 1600, block 2128 (x3 = 6384), head 176 -> 8160.
Rank 0 shards (dim 0, ceil): emb 50x16=800; block 32x16+32+8x64+8=1064 (x3 = 3192);
head 6x16=96 -> 4088. Rank 1: head 5x16=80 -> 4072.
Units: layers.0/1/2 (2128 each) and the root (emb + head = 1776): the largest is a block.

fp32 + Adam (2 states), rank 0:
  as_given / fsdp_per_layer: params 4088*4 = 16352, grads 16352, optim 32704,
      all-gather 2128*4 = 8512, reduce-scatter 8512 -> total 82432
  ddp: params 8160*4 = 32640, grads 32640, optim 65280 -> 130560
  fsdp_root_only: 16352 + 16352 + 32704 + 2 * 32640 -> 130688
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from rankscope import api
from rankscope.analysis.memory import layer_unit, parse_size
from rankscope.errors import InvalidInput
from rankscope.mcp_server import build_server
from tests.jobs import JobFactory, run_cli


@pytest.fixture(scope="module")
def placements(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("placements")
    factory = JobFactory(tmp_path_factory.mktemp("job"))
    try:
        job = factory.torchrun("fsdp_placement.py", nproc=2, args=["--out", str(out)])
        job.wait_ready(["rank0", "rank1"], timeout=120)
        assert job.wait_exit(60, "fsdp_placement.py to exit once its ranks wrote their placements") == 0, (
            job.output()
        )
    finally:
        factory.cleanup()
    return out


def plans(report: Any) -> dict[str, Any]:
    return {p.plan: p for p in report.plans}


@pytest.mark.slow
def test_budget_of_a_real_fsdp2_model(placements: Path) -> None:
    local0 = json.loads((placements / "local-bytes-rank0.json").read_text())["bytes"]
    local1 = json.loads((placements / "local-bytes-rank1.json").read_text())["bytes"]
    assert (local0, local1) == (4088 * 4, 4072 * 4)

    r0 = api.memory_budget(str(placements / "placements-rank0.json"), optimizer="adam", gpu_memory="100KiB")
    p = plans(r0)
    assert r0.world_size == 2 and r0.total_params == 8160
    given = p["as_given"]
    assert given.params_bytes == local0 == 16352
    assert (given.grads_bytes, given.optimizer_bytes) == (16352, 32704)
    assert given.units == 4 and given.largest_unit == "layers.0"
    assert (given.allgather_peak_bytes, given.reduce_scatter_peak_bytes) == (8512, 8512)
    assert given.total_bytes == 82432
    assert p["fsdp_per_layer"].total_bytes == 82432
    assert (p["ddp"].params_bytes, p["ddp"].optimizer_bytes, p["ddp"].total_bytes) == (32640, 65280, 130560)
    assert p["ddp"].allgather_peak_bytes == 0
    root = p["fsdp_root_only"]
    assert (root.units, root.allgather_peak_bytes, root.total_bytes) == (1, 32640, 130688)
    assert given.fits and not p["ddp"].fits and not root.fits
    assert given.headroom_bytes == 102400 - 82432
    assert r0.recommended == "fsdp_per_layer"
    assert not r0.findings

    # rank 1 holds the smaller head shard; the directory form budgets the heaviest rank (0)
    r1 = api.memory_budget(str(placements / "placements-rank1.json"))
    assert plans(r1)["as_given"].params_bytes == local1
    rdir = api.memory_budget(str(placements))
    assert plans(rdir)["as_given"].params_bytes == local0


@pytest.mark.slow
def test_budget_from_a_dcp_checkpoint(placements: Path) -> None:
    """`rankscope placements CKPT` knows global shapes only: the standard plans, no 'as_given'."""
    report = api.inspect_placements(str(placements / "ckpt"))
    b = api.memory_budget(report, world_size=2)
    p = plans(b)
    assert "as_given" not in p
    assert b.total_params == 8160
    assert p["ddp"].total_bytes == 130560
    assert p["fsdp_per_layer"].largest_unit == "model.layers.0"
    assert p["fsdp_per_layer"].total_bytes == 82432
    with pytest.raises(InvalidInput, match="world size unknown"):
        api.memory_budget(report)


@pytest.mark.slow
def test_budget_dtypes_optimizer_and_a_plan_that_does_not_fit(placements: Path) -> None:
    r = api.memory_budget(
        str(placements / "placements-rank0.json"), optimizer="sgd", param_dtype="bf16", gpu_memory="64KiB"
    )
    given = plans(r)["as_given"]
    # bf16 params and grads: 4088*2 each; sgd momentum fp32: 4088*4; all-gather/reduce-scatter 2128*2 each
    assert (given.params_bytes, given.grads_bytes, given.optimizer_bytes) == (8176, 8176, 16352)
    assert given.total_bytes == 8176 + 8176 + 16352 + 2 * 4256
    assert given.fits  # 41216 <= 65536
    tight = api.memory_budget(str(placements / "placements-rank0.json"), gpu_memory="40KiB")
    assert [f.kind for f in tight.findings] == ["budget_does_not_fit"]
    assert tight.recommended is None


@pytest.mark.slow
def test_budget_cli(placements: Path) -> None:
    path = str(placements / "placements-rank0.json")
    for argv in (["memory", "budget", path],):
        out = run_cli(*argv, "--gpu-memory", "100KiB", "--json", timeout=60)
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert data["recommended"] == "fsdp_per_layer"
        assert data["plans"][0]["total_bytes"] == 82432
    text = run_cli("memory", "budget", path, "--gpu-memory", "100KiB", timeout=60)
    assert text.returncode == 0 and "recommended: fsdp_per_layer" in text.stdout


@pytest.mark.slow
def test_mcp_memory_budget(placements: Path) -> None:
    async def go() -> tuple[Any, Any]:
        async with Client(build_server()) as client:
            ok = await client.call_tool(
                "memory_budget",
                {"placement": str(placements / "placements-rank0.json"), "gpu_memory": "100KiB"},
            )
            bad = await client.call_tool(
                "memory_budget",
                {"placement": str(placements / "placements-rank0.json"), "optimizer": "magic"},
            )
            return ok, bad

    ok, bad = anyio.run(go)
    assert not ok.is_error and ok.structured_content["recommended"] == "fsdp_per_layer"
    assert bad.is_error and "unknown optimizer" in bad.content[0].text


def test_simple_input_and_units_from_names() -> None:
    simple = {
        "world_size": 4,
        "params": [
            {"fqn": "tok.weight", "shape": [1000, 64]},
            {"fqn": "blocks.0.w", "shape": [64, 64]},
            {"fqn": "blocks.1.w", "shape": [64, 64]},
        ],
    }
    r = api.memory_budget(simple, optimizer="none")
    p = plans(r)
    assert "as_given" not in p  # no local shapes: the current plan is unknown
    assert p["ddp"].total_bytes == (64000 + 2 * 4096) * 4 * 2
    per_layer = p["fsdp_per_layer"]
    assert per_layer.largest_unit == "<root>" and per_layer.allgather_peak_bytes == 64000 * 4
    assert per_layer.params_bytes == (250 * 64 + 2 * 16 * 64) * 4
    assert [f.kind for f in r.findings] == ["fsdp_unit_too_large"]
    assert layer_unit("model.layers.12.attn.wq.weight") == "model.layers.12"
    assert layer_unit("norm.weight") == ""
    assert parse_size("80GiB") == parse_size("80GB") == 80 * 1024**3
    assert parse_size("81920MiB") == 80 * 1024**3


def test_budget_errors_carry_a_fix(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such placement file"):
        api.memory_budget(str(tmp_path / "none.json"))
    with pytest.raises(InvalidInput, match="world size unknown"):
        api.memory_budget({"params": [{"fqn": "w", "shape": [4]}]})
    with pytest.raises(InvalidInput, match="cannot read the size"):
        api.memory_budget({"world_size": 2, "params": [{"fqn": "w", "shape": [4]}]}, gpu_memory="lots")


def test_tensor_parallel_plan_has_no_allgather_peak() -> None:
    """DTensor shards without any FSDP wrapping (TP): the plan as given all-gathers nothing."""
    tp = {
        "world_size": 2,
        "wrapping": [],
        "tensors": [
            {
                "fqn": "layers.0.wq.weight",
                "kind": "param",
                "global_shape": [64, 32],
                "local_shape": [32, 32],
                "placements": ["Shard(dim=0)"],
                "dtype": "float32",
            },
            {
                "fqn": "layers.0.norm.weight",
                "kind": "param",
                "global_shape": [32],
                "local_shape": [32],
                "placements": ["Replicate()"],
                "dtype": "float32",
            },
            {
                "fqn": "layers.0.rope",
                "kind": "buffer",
                "global_shape": [1000],
                "local_shape": [1000],
                "dtype": "float32",
            },
        ],
    }
    given = plans(api.memory_budget(tp, optimizer="none"))["as_given"]
    assert given.allgather_peak_bytes == 0 and given.largest_unit is None
    assert given.params_bytes == (32 * 32 + 32) * 4  # the buffer is not a parameter
