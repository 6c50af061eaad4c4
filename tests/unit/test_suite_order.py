"""The suite's file order (tests/order.py): longest first, each file's tests together and in order,
and the measured costs name only files that exist."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.order import file_costs, longest_files_first
from tests.paths import ROOT


def test_the_costs_name_only_test_files_that_exist() -> None:
    costs = file_costs()
    assert costs, "tests/file_costs.json is missing or empty"
    missing = [name for name in costs if not (ROOT / name).is_file()]
    assert not missing, f"stale entries (rewrite with RANKSCOPE_FILE_COSTS=write): {missing}"


def test_long_files_go_first_and_keep_their_tests_in_order() -> None:
    costs = file_costs()
    short, long = sorted(costs, key=costs.__getitem__)[0], max(costs, key=costs.__getitem__)
    fake = [SimpleNamespace(path=ROOT / name, n=n) for n, name in enumerate([short, long, short, long])]
    items = cast(list[pytest.Item], fake)
    longest_files_first(items, ROOT)
    got: list[Any] = list(items)
    assert [(Path(i.path).relative_to(ROOT).as_posix(), i.n) for i in got] == [
        (long, 1),
        (long, 3),
        (short, 0),
        (short, 2),
    ]


def test_the_test_processes_take_the_files_in_that_order(pytestconfig: pytest.Config) -> None:
    """pytest-xdist's loadfile would hand out the files with the most tests first (its
    --loadscope-reorder default); tests/conftest.py turns that off so the order above holds."""
    assert pytestconfig.option.loadscopereorder is False
