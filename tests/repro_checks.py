"""Verify repro templates for real (``verify_repro``: torchrun, CPU, gloo) and check what each showed.

Each test verifies one template, its buggy and its fixed rendering side by side, so a test's time is
that of one run whatever else shares the machine; the template files are split by symptom source
(tests/integration/test_repro_hangs.py, test_repro_crashes.py) so that the test processes share them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rankscope.capabilities.repro import list_templates, render_repro, verify_repro
from rankscope.models.repro import VerifyResult

HANG_TIMEOUT = 6.0
"""Quiet seconds before a run is judged hung: a hung repro waits this long, a working one never does."""

RUN_TIMEOUT = 120.0
"""One run's limit: a run takes 10-40 s with three test processes on two cores; a run past this says
"timeout" in its answer (``check`` prints it) well before pytest-timeout's 300 s."""


def cpu_templates(source: str) -> list[str]:
    """The templates that run on CPU whose symptom is judged from ``source`` (verdict, finding, probe)."""
    return [t.name for t in list_templates().templates if not t.requires_cuda and t.symptom_source == source]


def verify_scripts(scripts: list[Path]) -> list[VerifyResult]:
    """Verify rendered scripts side by side (one thread each: a run mostly waits on its ranks)."""

    def one(script: Path) -> VerifyResult:
        # nproc=None: the world size each repro was rendered for
        return verify_repro(str(script), nproc=None, hang_timeout=HANG_TIMEOUT, timeout=RUN_TIMEOUT)

    with ThreadPoolExecutor(max(1, len(scripts))) as pool:
        return list(pool.map(one, scripts))


def verify_template(name: str, tmp_path: Path) -> list[VerifyResult]:
    """Render ``name`` buggy and fixed into ``tmp_path`` and verify both; [buggy, fixed]."""
    scripts: list[Path] = []
    for fixed in (False, True):
        out = tmp_path / f"{name}{'_fixed' if fixed else ''}.py"
        render_repro(name, fixed=fixed, out=str(out))
        scripts.append(out)
    return verify_scripts(scripts)


def check(results: list[VerifyResult]) -> None:
    """Each buggy run showed its declared symptom, the way its source judges it; each fixed run ran clean."""
    bad = [
        f"{r.template} fixed={r.fixed}: {r.answer} ({r.outcome}, {r.duration_s:.0f} s): {r.summary} {r.evidence}"
        for r in results
        if not r.ok
    ]
    assert not bad, "\n".join(bad)
    for r in results:
        assert r.answer == ("clean" if r.fixed else "reproduced"), r
        if r.fixed:
            assert r.outcome == "ok" and r.exit_code == 0
        elif r.symptom_source == "verdict" and r.symptom == "all_in_same_collective":
            # every rank in the same blocking recv: no rank is the suspect, the summary names the deadlock
            assert r.outcome == "hung" and r.verdict_kind == r.symptom and not r.suspect_ranks
            assert any("send/recv ordering deadlock" in e for e in r.evidence), r.evidence
        elif r.symptom_source == "verdict":
            assert r.outcome == "hung" and r.verdict_kind == r.symptom and r.suspect_ranks
        elif r.symptom_source == "finding":
            assert r.outcome == "crashed" and r.symptom in r.finding_kinds
        else:
            assert any(f"SYMPTOM {r.symptom}" in e for e in r.evidence)
