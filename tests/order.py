"""The order the suite's files are handed to its test processes: the longest first.

With ``-n 3 --dist loadfile`` each process takes the next file as it finishes one, in collection
order, once pytest-xdist's own reordering (the files with the most tests first) is off, as
tests/conftest.py sets. In name order, or xdist's, the long live files (test_watch_*, the repro
runs) came late, and the suite ended with one process running them alone while the others sat
idle. Longest first (the classic longest-processing-time rule) lets the short files fill the end.

The seconds per file are measured, not guessed: ``RANKSCOPE_FILE_COSTS=write`` rewrites
tests/file_costs.json from the run's own durations. A file not in it counts as a short one.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

COSTS = Path(__file__).with_name("file_costs.json")
UNKNOWN_S = 5.0
"""A file the costs do not name yet (a new one): after the long files, before the quick ones."""


def file_costs() -> dict[str, float]:
    """Seconds per test file (its path from the repository root), as last measured."""
    try:
        data = json.loads(COSTS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()}


def _key(item: pytest.Item, root: Path, costs: dict[str, float]) -> float:
    return -costs.get(item.path.relative_to(root).as_posix(), UNKNOWN_S)


def longest_files_first(items: list[pytest.Item], root: Path) -> None:
    """Reorder ``items`` in place by their file's cost, longest first; a file's own tests keep their
    order (the sort is stable, and a file's tests share one key)."""
    costs = file_costs()
    items.sort(key=lambda item: _key(item, root, costs))


class CostRecorder:
    """Sums each file's setup, call and teardown seconds over a run and writes them to COSTS at
    its end (``RANKSCOPE_FILE_COSTS=write``; in the controller, which sees every worker's reports)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if os.environ.get("PYTEST_XDIST_WORKER") or not self.seconds:  # a worker, or nothing ran
            return
        costs = {k: round(v, 1) for k, v in sorted(self.seconds.items()) if v >= 0.5}
        COSTS.write_text(json.dumps(costs, indent=1) + "\n")
