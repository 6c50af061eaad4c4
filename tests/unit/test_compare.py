"""`rankscope compare` / MCP `check_tensor_consistency` over files the ranks saved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from mcp import Client

from rankscope.capabilities.consistency import compare_dir
from rankscope.cli import main
from rankscope.errors import InvalidInput, NothingToRead
from rankscope.mcp_server import build_server
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "probe"


def state_dicts(
    tmp_path: Path, odd_rank: int | None = None, extra_key_rank: int | None = None, n: int = 3
) -> Path:
    out = tmp_path / "sd"
    out.mkdir()
    for rank in range(n):
        torch.manual_seed(1 if rank == odd_rank else 0)
        sd: dict[str, Any] = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).state_dict()
        if rank == extra_key_rank:
            sd["adapter.weight"] = torch.zeros(2)
        torch.save(sd, out / f"model_rank{rank}.pt")
    return out


def test_fingerprint_files_from_the_job() -> None:
    report = compare_dir(str(DATA / "nobcast"))
    assert not report.consistent
    assert [(d.name, d.ranks) for d in report.divergent][:2] == [("0.weight", [2]), ("0.bias", [2])]
    assert report.world_size == 3 and report.ranks == [0, 1, 2] and report.problems == []


def test_state_dicts_one_rank_diverges(tmp_path: Path) -> None:
    report = compare_dir(str(state_dicts(tmp_path, odd_rank=1)))
    assert not report.consistent
    assert [d.name for d in report.divergent] == ["0.weight", "0.bias"]  # LayerNorm's ones/zeros still agree
    assert all(d.ranks == [1] and d.reference_ranks == [0, 2] for d in report.divergent)


def test_state_dicts_that_agree(tmp_path: Path) -> None:
    report = compare_dir(str(state_dicts(tmp_path)))
    assert report.consistent and report.compared == 4 and report.world_size == 3


def test_mismatched_key_sets(tmp_path: Path) -> None:
    report = compare_dir(str(state_dicts(tmp_path, extra_key_rank=2)))
    assert not report.consistent
    assert [(k.name, k.present_on, k.missing_on) for k in report.missing_keys] == [
        ("adapter.weight", [2], [0, 1])
    ]


def test_empty_dir_and_not_a_dir(tmp_path: Path) -> None:
    """An empty folder is nothing to read (exit 2), not an inconsistency found (exit 1)."""
    with pytest.raises(NothingToRead, match=r"no fingerprints-rank<R>\.json") as caught:
        compare_dir(str(tmp_path))
    assert caught.value.exit_code == 2 and str(tmp_path) in caught.value.message
    with pytest.raises(InvalidInput):
        compare_dir(str(tmp_path / "missing"))


def test_files_from_two_jobs_and_garbage(tmp_path: Path) -> None:
    d = tmp_path / "fp"
    shutil.copytree(DATA / "nobcast", d)
    f = d / "fingerprints-rank1.json"
    data = json.loads(f.read_text())
    data["job_id"] = "10.0.0.9:29500"
    data["world_size"] = 8
    f.write_text(json.dumps(data))
    (d / "fingerprints-rank5.json").write_text("{not json")
    (d / "notes_rank9.pt").write_bytes(b"not a pickle")
    report = compare_dir(str(d))
    assert not report.consistent
    joined = "\n".join(report.problems)
    assert "2 different jobs" in joined and "different world sizes [3, 8]" in joined
    assert "fingerprints-rank5.json: not a rankscope fingerprint file" in joined
    assert "mixes fingerprint files and state_dict files" not in joined  # the broken .pt never loaded


def test_non_tensor_pickles_are_refused_by_weights_only(tmp_path: Path) -> None:
    d = tmp_path / "sd"
    d.mkdir()
    torch.save({"w": torch.ones(2)}, d / "rank0.pt")
    torch.save({"w": torch.ones(2), "obj": Path("x")}, d / "rank1.pt")  # not loadable with weights_only=True
    report = compare_dir(str(d))
    assert any(
        p.startswith("rank1.pt: cannot be loaded with torch.load(weights_only=True)") for p in report.problems
    )
    assert not report.consistent


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sd = state_dicts(tmp_path, odd_rank=0)
    assert main(["compare", str(sd), "--json"]) == 1  # 1: the ranks disagree
    data = json.loads(capsys.readouterr().out)
    assert data["consistent"] is False
    assert (data["divergent"][0]["name"], data["divergent"][0]["ranks"]) == ("0.weight", [0])
    assert main(["compare", str(sd)]) == 1
    text = capsys.readouterr().out
    first, second = text.splitlines()[:2]
    assert first == "rank 0 differs from ranks 1-2 in 2 of 4 compared tensors (first: 0.weight, values)"
    assert second.startswith("INCONSISTENT: 2 of 4 compared tensors differ (rank 0)")
    assert "0.weight: ranks [0] differ from [1, 2] (values)" in text
    assert main(["compare", str(tmp_path / "missing")]) == 2
    assert "Fix:" in capsys.readouterr().err


def test_mcp_tools_in_memory(tmp_path: Path) -> None:
    async def go() -> tuple[Any, ...]:
        async with Client(build_server()) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            cons = await client.call_tool("check_tensor_consistency", {"path": str(DATA / "nobcast")})
            place = await client.call_tool("inspect_placements", {"path": str(DATA / "dcp_fsdp2")})
            bad = await client.call_tool("inspect_placements", {"path": str(tmp_path / "missing")})
            return tools, cons, place, bad

    tools, cons, place, bad = anyio.run(go)
    for name in ("check_tensor_consistency", "inspect_placements"):
        assert tools[name].annotations.read_only_hint is True
        assert tools[name].output_schema is not None
    assert not cons.is_error and cons.structured_content["consistent"] is False
    assert cons.structured_content["divergent"][0]["name"] == "0.weight"
    assert not place.is_error and place.structured_content["tensors"][0]["layout"] == "sharded"
    assert bad.is_error and "Fix:" in bad.content[0].text
