"""Repro templates as data: every template renders and parses, parameters are bounded, injections are rejected,
and from-report picks the right template from reports captured from real failing jobs.

The reports under tests/data/repro/ were captured from real runs of the repros
(`rankscope run` on 2 gloo ranks: its StacksReport when hung, `rankscope triage`
on its output when crashed); see tests/data/repro/README.md.

The tests here start processes; the pure ones are in tests/unit/test_repro_templates.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rankscope.capabilities.repro import render_repro
from rankscope.errors import InvalidInput
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "repro"


PROBE_KINDS = {"divergent_tensors", "peak_memory"}

INJECTIONS = [
    '"); import os; os.system("x")#',
    "x'); __import__('os').system('id')#",
    "all_reduce\nimport os",
    "4); import os #",
    "${{ os }}",
    "{{ 7*7 }}",
]

# Companion values tried when an edge value needs others to stay meaningful (a rank < world_size,
# two different ops, a dataset that does not split evenly).
_COMPANIONS: list[dict[str, Any]] = [
    {},
    {"world_size": 8},
    {"batch_size": 1},
    {"batch_size": 1, "world_size": 3},
    {"dataset_size": 2049},
    {"crash_index": 0},
    {"crash_index": 0, "world_size": 2, "dataset_size": 100000},
]


def test_render_writes_an_executable_script(tmp_path: Path) -> None:
    out = tmp_path / "repro.py"
    r = render_repro("collective_order", {"op_a": "all_gather", "op_b": "barrier"}, out=str(out))
    assert r.path == str(out.resolve()) and out.read_text() == r.script
    assert out.stat().st_mode & stat.S_IXUSR
    assert r.run_commands[0] == f"torchrun --nproc_per_node=2 {out}"
    with pytest.raises(InvalidInput):
        render_repro("collective_order", out=str(tmp_path / "missing" / "repro.py"))
    with pytest.raises(InvalidInput):
        render_repro("no_such_template")


def test_importing_the_faces_does_not_import_torch() -> None:
    code = (
        "import sys; import rankscope.capabilities.repro, rankscope.commands.repro, rankscope.mcp_tools.repro, "
        "rankscope.analysis.templates; rankscope.capabilities.repro.render_repro('skip_collective'); "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0
