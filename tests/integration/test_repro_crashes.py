"""Every crash, wrong-result and memory template, run for real on CPU with gloo through ``rankscope
run`` (``verify_repro``): the buggy rendering shows the symptom it declares (a log-triage finding of
its crash, or the repro's own cross-rank check line), and the fixed rendering runs clean. One test
per template (tests/repro_checks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.repro_checks import check, cpu_templates, verify_template

pytestmark = pytest.mark.slow

CRASHES = cpu_templates("finding")
PROBES = cpu_templates("probe")


def test_every_kind_of_crash_and_wrong_result_has_a_template() -> None:
    assert len(CRASHES) >= 5, CRASHES
    assert set(PROBES) >= {"missing_broadcast", "bn_drift", "fsdp2_root_only"}, PROBES


@pytest.mark.parametrize("name", CRASHES)
def test_crash_template_shows_its_triage_finding_and_its_fixed_version_finishes(
    name: str, tmp_path: Path
) -> None:
    buggy, fixed = verify_template(name, tmp_path)
    check([buggy, fixed])
    assert (buggy.fixed, fixed.fixed, buggy.symptom_source) == (False, True, "finding")


@pytest.mark.parametrize("name", PROBES)
def test_wrong_result_and_memory_template_reports_its_probe_symptom(name: str, tmp_path: Path) -> None:
    buggy, fixed = verify_template(name, tmp_path)
    check([buggy, fixed])
    assert (buggy.fixed, fixed.fixed, buggy.symptom_source) == (False, True, "probe")
