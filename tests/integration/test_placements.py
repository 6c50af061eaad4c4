"""Placement math and the offline inspector (`rankscope placements`).

Data: a real torch.distributed.checkpoint written by FSDP2 on 4 CPU ranks and
the placement reports ``rankscope.probe.dump(..., kind="placements")`` wrote
in the same job (tests/programs/probe_sharded.py), kept under tests/data/probe.

The tests here start processes; the pure ones are in tests/unit/test_placements.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rankscope.capabilities.placements import inspect_placements
from tests.jobs import run_cli
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "probe"


def test_inspect_saved_placement_reports_tiles_and_detects_mixed_jobs(tmp_path: Path) -> None:
    report = inspect_placements(str(DATA / "fsdp_placements"))
    assert report.source == "placement_report" and report.problems == []
    w = {t.fqn: t for t in report.tensors}["blocks.1.fc2.weight"]
    assert [ch.ranks for ch in w.chunks] == [[0], [1], [2], [3]]
    mixed = tmp_path / "mixed"
    shutil.copytree(DATA / "fsdp_placements", mixed)
    f = mixed / "placements-rank2.json"
    data = json.loads(f.read_text())
    data["job_id"] = "other:1"
    f.write_text(json.dumps(data))
    (mixed / "placements-rank3.json").unlink()
    problems = inspect_placements(str(mixed)).problems
    assert any("2 different jobs" in p for p in problems)
    assert any("missing [3]" in p for p in problems)


def test_cli_entry_point_runs() -> None:
    out = run_cli("placements", str(DATA / "rootonly_placement-rank0.json"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["source"] == "placement_report"
