"""Every hang template, run for real on CPU with gloo through ``rankscope run`` (``verify_repro``):
the buggy rendering hangs with the verdict it declares, decided by rankscope's own stacks verdict,
and the fixed rendering runs clean. One test per template (tests/repro_checks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.repro_checks import check, cpu_templates, verify_template

pytestmark = pytest.mark.slow

HANGS = cpu_templates("verdict")


def test_every_kind_of_hang_has_a_template() -> None:
    assert len(HANGS) >= 5 and {"extra_collective", "nonfinite_skip"} <= set(HANGS), HANGS


@pytest.mark.parametrize("name", HANGS)
def test_hang_template_shows_its_verdict_and_its_fixed_version_finishes(name: str, tmp_path: Path) -> None:
    buggy, fixed = verify_template(name, tmp_path)
    check([buggy, fixed])
    assert (buggy.fixed, fixed.fixed, buggy.symptom_source) == (False, True, "verdict")
    if name == "extra_collective":
        assert buggy.suspect_ranks == [0]  # the rank in the extra barrier, decided by its guard
    if name == "nonfinite_skip":
        assert 1 in buggy.suspect_ranks  # the rank that dropped its bad batch
