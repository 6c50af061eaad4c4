"""Every repro template, run for real on CPU with gloo: the bug shows its declared symptom as judged by
rankscope's own stacks verdict / log triage (through ``verify_repro``), and the fixed rendering runs clean.

Runs go through ``rankscope run`` (torchrun, 2 ranks, a short hang timeout), a
few at a time in threads so the suite stays within a few minutes on 2 cores.
Self-launch (`python repro.py`) and the built-in timeout are tested directly.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rankscope.capabilities.repro import list_templates, render_repro, repro_from_report, verify_repro
from rankscope.models.repro import VerifyResult
from tests.jobs import JobFactory, wait_for
from tests.paths import DATA as DATA_ROOT

pytestmark = pytest.mark.slow

DATA = DATA_ROOT / "repro"

HANG_TIMEOUT = 6.0
RUN_TIMEOUT = 150.0
PARALLEL = 4
"""Runs at once: a hung run mostly waits (quiet time, stack capture), so more than 2 fit on 2 cores."""


def _verify_all(names: list[str], tmp_path: Path, extra: list[Path] | None = None) -> list[VerifyResult]:
    """Render each template buggy and fixed, add the ``extra`` rendered scripts, verify them all in a pool."""
    scripts: list[Path] = []
    for name in names:
        for fixed in (False, True):
            out = tmp_path / f"{name}{'_fixed' if fixed else ''}.py"
            render_repro(name, fixed=fixed, out=str(out))
            scripts.append(out)
    scripts.extend(extra or [])

    def one(script: Path) -> VerifyResult:
        # nproc=None: the world size each repro was rendered for
        return verify_repro(str(script), nproc=None, hang_timeout=HANG_TIMEOUT, timeout=RUN_TIMEOUT)

    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(one, scripts))


@pytest.fixture(scope="module")
def cpu_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[VerifyResult]]:
    """Every CPU template, buggy and fixed, plus a repro made from a real hung job's report, verified in one pool."""
    tmp = tmp_path_factory.mktemp("repros")
    names = [t.name for t in list_templates().templates if not t.requires_cuda]
    by_source = {t.name: t.symptom_source for t in list_templates().templates}
    from_report = tmp / "from_report.py"
    repro_from_report(str(DATA / "stacks_user_mismatch.json"), out=str(from_report))
    results = _verify_all(names, tmp, extra=[from_report])
    grouped: dict[str, list[VerifyResult]] = {"from_report": [results.pop()]}
    for r in results:
        grouped.setdefault(by_source[r.template], []).append(r)
    return grouped


def _check(results: list[VerifyResult]) -> None:
    bad = [f"{r.template} fixed={r.fixed}: {r.answer}: {r.summary} {r.evidence}" for r in results if not r.ok]
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


def test_hang_templates_show_their_verdict_and_fixed_versions_finish(
    cpu_results: dict[str, list[VerifyResult]],
) -> None:
    results = cpu_results["verdict"]
    assert len({r.template for r in results}) >= 5
    _check(results)
    buggy = {r.template: r for r in results if not r.fixed}
    assert buggy["extra_collective"].suspect_ranks == [
        0
    ]  # the rank in the extra barrier, decided by its guard
    assert 1 in buggy["nonfinite_skip"].suspect_ranks  # the rank that dropped its bad batch


def test_crash_templates_show_their_triage_finding_and_fixed_versions_finish(
    cpu_results: dict[str, list[VerifyResult]],
) -> None:
    results = cpu_results["finding"]
    assert len({r.template for r in results}) >= 5
    _check(results)


def test_wrong_result_and_memory_templates_report_their_probe_symptom(
    cpu_results: dict[str, list[VerifyResult]],
) -> None:
    results = cpu_results["probe"]
    assert {r.template for r in results} >= {"missing_broadcast", "bn_drift", "fsdp2_root_only"}
    _check(results)


def test_a_repro_generated_from_a_real_hung_jobs_report_shows_the_same_verdict(
    cpu_results: dict[str, list[VerifyResult]],
) -> None:
    """tests/programs/hang_collectives.py hung with rank 1 in barrier and ranks 0, 2 in all_reduce; the repro
    rendered from its `rankscope stacks --json` report, run on 3 ranks, hangs the same way."""
    (result,) = cpu_results["from_report"]
    _check([result])
    assert result.template == "skip_collective" and result.suspect_ranks == [1]
    assert any("rank 1 waits in barrier" in e for e in result.evidence)


def test_cuda_template_says_it_needs_cuda_and_exits_with_the_skip_code(tmp_path: Path) -> None:
    """Without CUDA the OOM repro says so and exits 77, and verification answers "skipped"; with CUDA it
    must show the OOM (and its fix must not)."""
    import torch

    out = tmp_path / "oom.py"
    r = render_repro("cuda_oom_growth", out=str(out))
    assert r.requires_cuda
    if torch.cuda.is_available():
        _check(_verify_all(["cuda_oom_growth"], tmp_path))
        return
    done = subprocess.run([sys.executable, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 77, done.stdout + done.stderr
    assert "rankscope-repro: skipped: needs CUDA" in done.stdout
    verdict = verify_repro(str(out), nproc=2, hang_timeout=HANG_TIMEOUT, timeout=RUN_TIMEOUT)
    assert verdict.answer == "skipped" and verdict.ok, verdict
    assert any("needs CUDA" in e for e in verdict.evidence)


def test_python_repro_py_launches_its_own_ranks(tmp_path: Path, jobs: JobFactory) -> None:
    """`python repro.py`: the fixed script spawns 2 ranks and exits 0; the buggy one hangs until its built-in
    timeout ends it with a message and exit code 124 instead of hanging forever."""
    fixed = tmp_path / "fixed.py"
    render_repro("skip_collective", fixed=True, out=str(fixed))
    buggy = tmp_path / "buggy.py"
    render_repro("skip_collective", {"timeout_s": 10}, out=str(buggy))
    ok_job = jobs.python(str(fixed))
    hung_job = jobs.python(str(buggy))
    wait_for(lambda: ok_job.proc.poll() is not None, 120, "the fixed self-launched repro to finish")
    assert ok_job.proc.returncode == 0, ok_job.output()
    assert ok_job.output().count("done: no symptom") == 2
    wait_for(lambda: hung_job.proc.poll() is not None, 150, "the built-in timeout to end the hung repro")
    assert hung_job.proc.returncode == 124, hung_job.output()
    assert "rankscope-repro: TIMEOUT: rank" in hung_job.output() and "this is the hang" in hung_job.output()


@pytest.mark.parametrize(
    ("template", "params", "suspect"),
    [
        (
            "extra_collective",
            {"world_size": 3, "extra_rank": 1},
            1,
        ),  # the rank guard is quoted from the source
        ("nonfinite_skip", {"world_size": 3, "bad_rank": 2}, 2),  # the rank past the loop the others are in
        ("skip_collective", {"world_size": 3, "op": "barrier", "next_op": "all_reduce", "skip_rank": 0}, 0),
    ],
)
def test_round_trip_a_hang_its_report_and_the_repro_chosen_from_it(
    tmp_path: Path, template: str, params: dict[str, int | str], suspect: int
) -> None:
    """A job that hangs in this way (the buggy repro itself), its stacks report, and the repro
    rankscope chooses from that report: the same template, the same rank, and it reproduces."""
    from rankscope.capabilities.launch import run_job

    job = tmp_path / "job.py"
    render_repro(template, params, out=str(job))
    run = run_job(str(job), nproc=3, hang_timeout=HANG_TIMEOUT, timeout=RUN_TIMEOUT)
    assert run.outcome == "hung" and run.stacks is not None, run.summary
    assert run.stacks.verdict.suspect_ranks == [suspect], run.stacks.verdict
    again = repro_from_report(run, out=str(tmp_path / "repro.py"))
    assert again.template == template, again.reasons
    result = verify_repro(str(tmp_path / "repro.py"), nproc=3, hang_timeout=HANG_TIMEOUT, timeout=RUN_TIMEOUT)
    assert result.answer == "reproduced" and result.suspect_ranks == [suspect], result
