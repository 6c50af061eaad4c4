"""Where the test suite's files are, for tests at any depth (tests/unit, tests/integration)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"
PROGRAMS = TESTS / "programs"
ROOT = TESTS.parent
"""The repository root (pyproject.toml, SKILL.md, tools/)."""
