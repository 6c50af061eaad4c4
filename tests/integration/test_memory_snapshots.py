"""Snapshot analysis on files in the real ``_dump_snapshot`` layout, built with known values.

The tests here start processes; the pure ones are in tests/unit/test_memory_snapshots.py.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from rankscope.capabilities.memory import SnapshotUnreadable, load_snapshot
from tests.jobs import run_cli
from tests.paths import DATA
from tests.unit.test_memory_snapshots import fragmented


class _Evil:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (self.target,))


def test_restricted_unpickler_refuses_code(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    evil = tmp_path / "snapshot-rank0.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": _Evil(str(target))}))
    with pytest.raises(SnapshotUnreadable, match=r"refusing to load posix\.mkdir"):
        load_snapshot(evil)
    assert not target.exists()
    # through the CLI: a message with a fix, exit 2, no traceback
    out = run_cli("memory", str(evil), timeout=60)
    assert out.returncode == 2
    assert "refusing to load" in out.stderr and "Fix:" in out.stderr and "Traceback" not in out.stderr
    assert not target.exists()


def test_cli_json_matches_the_library(tmp_path: Path) -> None:
    path = fragmented(tmp_path)
    out = run_cli("memory", str(path), "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["mode"] == "snapshots"
    assert data["snapshots"][0]["fragmentation"]["kind"] == "fragmentation"
    text = run_cli("memory", str(path), timeout=60)
    assert (
        text.returncode == 0
        and "oom_fragmentation" in text.stdout
        and "fix: Set PYTORCH_CUDA_ALLOC_CONF" in text.stdout
    )


def test_triage_brief_of_a_dead_oom_folder_names_the_leak() -> None:
    """The skill's first call for a dead job reads the snapshots in its folder."""
    out = run_cli("triage", "--brief", str(DATA / "postmortem" / "oom_leak"), timeout=60)
    assert "Traceback" not in out.stderr, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("verdict: From the memory snapshots: Leak on rank 3")
    assert "model.py:48 in forward <- /workspace/lm/train.py:77 in main" in first and "every 10th" in first
    assert "next 1: Fix: /workspace/lm/train.py:82 `last_token_logits.append(logits[:, -1])`" in out.stdout
