"""Golden files: a whole answer per case, kept word for word and compared after every change.

``RANKSCOPE_REGOLD=1`` rewrites the file instead of comparing (the test is then skipped, so a
rewrite never passes as a check); review its diff before committing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest


def check_golden(golden: Path, got: dict[str, Any], what: str) -> None:
    """Assert that ``got`` (case name -> JSON-ready answer) equals the golden file, naming the first
    case that differs and each of its fields that do; or rewrite the file under RANKSCOPE_REGOLD."""
    if os.environ.get("RANKSCOPE_REGOLD"):
        golden.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"rewrote {golden}")
    want = json.loads(golden.read_text())
    assert sorted(got) == sorted(want), "the cases changed: rewrite the golden file and review the diff"
    changed = [name for name in sorted(want) if got[name] != want[name]]
    assert not changed, (
        f"{len(changed)} {what} differ, first {changed[0]}: {_diff(got[changed[0]], want[changed[0]])}"
    )


def _diff(got: dict[str, Any], want: dict[str, Any]) -> str:
    return "; ".join(
        f"{k}: {got.get(k)!r} != {want.get(k)!r}" for k in sorted(want) if got.get(k) != want.get(k)
    )
