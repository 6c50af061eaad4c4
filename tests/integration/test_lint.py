"""The code stays as the house rules say: ruff clean, formatted, and mypy --strict clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT

BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_check_and_format() -> None:
    check = _run(str(BIN / "ruff"), "check", "tools", "tests", "benchmarks")
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _run(str(BIN / "ruff"), "format", "--check", "tools", "tests", "benchmarks")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy_strict_on_the_package() -> None:
    """pyproject.toml's [tool.mypy] sets strict = true; this runs it on the whole package."""
    out = _run(sys.executable, "-m", "mypy", "tools/rankscope")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout
