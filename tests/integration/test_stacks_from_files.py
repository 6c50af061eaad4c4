"""``rankscope stacks --from`` / ``dump_stacks(from_paths=...)`` on stacks saved from real jobs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest
from mcp.server.mcpserver.exceptions import ToolError

from rankscope.capabilities.saved_stacks import stacks_from_files
from rankscope.errors import InvalidInput
from tests.live_stacks import run_cli
from tests.paths import DATA

FILES = DATA / "stacks" / "files"


@pytest.mark.parametrize("folder", ["pyspy_text", "pyspy_json", "pyspy_native_text"])
def test_saved_pyspy_dumps_give_the_live_verdict(folder: str) -> None:
    report = stacks_from_files([str(FILES / folder)])
    assert report.verdict.kind == "mismatched_collectives"
    assert report.verdict.suspect_ranks == [2]
    assert [s.rank for s in report.stacks] == [0, 1, 2]
    assert not report.errors


@pytest.mark.parametrize("folder", ["subgroup_locals_text", "subgroup_locals_json"])
def test_saved_dumps_with_locals_name_the_member_that_left_a_subgroup(folder: str) -> None:
    """py-spy --locals dumps of the subgroup hang (capture_subgroup.sh): the `pairs` table in every
    rank's locals names rank 3 as the member of rank 2's group that went on."""
    report = stacks_from_files([str(FILES / folder)])
    v = report.verdict
    assert v.kind == "mismatched_collectives" and v.suspect_ranks == [3] and v.confidence == "high"
    assert "entry 1 of `pairs` in main (hang_subgroup.py): ranks 2-3 hold a ProcessGroup" in v.evidence[0]


def test_torchrun_log_of_faulthandler_output() -> None:
    report = stacks_from_files([str(FILES / "faulthandler_torchrun.log")])
    assert report.verdict.kind == "mismatched_collectives" and report.verdict.suspect_ranks == [1]
    assert "rank 1 waits in barrier at fh.py:6" in report.verdict.summary


def test_broken_files_are_reported_each_and_the_rest_analysed(tmp_path: Path) -> None:
    for rank in (0, 1, 2):
        shutil.copy(FILES / "pyspy_json" / f"stacks_rank_{rank}.json", tmp_path / f"stacks_rank_{rank}.json")
    (tmp_path / "stacks_rank_3.json").write_text('[{"frames": [')  # truncated
    (tmp_path / "rank4.txt").write_text("no stacks in here\n")
    (tmp_path / "notes.txt").write_text('Thread 9 (idle): "MainThread"\n    main (train.py:3)\n')
    report = stacks_from_files([str(tmp_path)])
    assert report.verdict.suspect_ranks == [2]
    by_kind = {e.kind: e for e in report.errors}
    assert set(by_kind) == {"unknown_format", "no_rank"}
    assert sum(e.kind == "unknown_format" for e in report.errors) == 2
    assert "notes.txt" in by_kind["no_rank"].message and by_kind["no_rank"].fix
    assert all(e.fix for e in report.errors)


def test_nothing_readable_names_no_suspect(tmp_path: Path) -> None:
    (tmp_path / "rank0.txt").write_text("garbage")
    report = stacks_from_files([str(tmp_path)])
    assert report.verdict.kind == "inconclusive" and report.verdict.suspect_ranks == []


def test_missing_path_is_a_usage_error() -> None:
    with pytest.raises(InvalidInput):
        stacks_from_files(["/no/such/stacks"])


def test_cli_from_json_and_backend() -> None:
    code, out, _ = run_cli("stacks", "--from", str(FILES / "pyspy_text"), "--backend", "gloo", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["verdict"]["suspect_ranks"] == [2] and data["job"]["backend"] == "gloo"


def test_cli_from_with_pid_is_refused() -> None:
    code, _, err = run_cli("stacks", "--from", str(FILES / "pyspy_text"), "--pid", "1")
    assert code == 2 and "cannot be combined" in err


def test_mcp_dump_stacks_from_paths() -> None:
    from rankscope.mcp_tools.jobs import dump_stacks

    async def main() -> None:
        report = await dump_stacks(from_paths=[str(FILES / "pyspy_json")])
        assert report.verdict.suspect_ranks == [2]
        with pytest.raises(ToolError):
            await dump_stacks(from_paths=[str(FILES / "pyspy_json")], pid=1)

    anyio.run(main)


def test_secrets_in_saved_locals_never_leave(tmp_path: Path) -> None:
    secret = "hf_plantedSecretValue0123456789"
    text = (
        "Process 7: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 7 (idle): "MainThread"\n'
        "    main (train.py:12)\n"
        "        Locals:\n"
        f"            cfg: {{'hub': {{'token': '{secret}'}}, 'lr': 0.1}}\n"
        f"            headers: {{'Authorization': 'Bearer {secret}'}}\n"
    )
    (tmp_path / "rank0.txt").write_text(text)
    code, out, _ = run_cli("stacks", "--from", str(tmp_path), "--json", "--full")
    assert code == 0 and secret not in out and "'lr': 0.1" in out

    from rankscope.mcp_tools.jobs import dump_stacks

    async def main() -> str:
        report = await dump_stacks(from_paths=[str(tmp_path)], full_ranks=[0])
        return report.model_dump_json()

    assert secret not in anyio.run(main)
