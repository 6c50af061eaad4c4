"""Repros beyond the catalog's own renderings, run for real on CPU with gloo: a repro made from a real
hung job's report, the CUDA template without CUDA, self-launch (`python repro.py`) with its built-in
timeout, and the round trip from a hung job to the repro chosen from its report.

Every template's own buggy and fixed renderings are verified in tests/integration/test_repro_hangs.py
and test_repro_crashes.py, one test per template (tests/repro_checks.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.capabilities.repro import list_templates, render_repro, repro_from_report, verify_repro
from tests.jobs import JobFactory
from tests.paths import DATA as DATA_ROOT
from tests.repro_checks import (
    HANG_TIMEOUT,
    RUN_TIMEOUT,
    check,
    cpu_templates,
    verify_scripts,
    verify_template,
)

pytestmark = pytest.mark.slow

DATA = DATA_ROOT / "repro"


def test_every_cpu_template_is_verified_by_the_source_of_its_symptom() -> None:
    """test_repro_hangs.py and test_repro_crashes.py take the templates by source: none is left out."""
    cpu = {t.name for t in list_templates().templates if not t.requires_cuda}
    by_source = [cpu_templates(source) for source in ("verdict", "finding", "probe")]
    assert sorted(n for names in by_source for n in names) == sorted(cpu)


def test_a_repro_generated_from_a_real_hung_jobs_report_shows_the_same_verdict(tmp_path: Path) -> None:
    """tests/programs/hang_collectives.py hung with rank 1 in barrier and ranks 0, 2 in all_reduce; the repro
    rendered from its `rankscope stacks --json` report, run on 3 ranks, hangs the same way."""
    from_report = tmp_path / "from_report.py"
    repro_from_report(str(DATA / "stacks_user_mismatch.json"), out=str(from_report))
    (result,) = verify_scripts([from_report])
    check([result])
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
        check(verify_template("cuda_oom_growth", tmp_path))
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
    assert ok_job.wait_exit(120, "the fixed self-launched repro to finish") == 0, ok_job.output()
    assert ok_job.output().count("done: no symptom") == 2
    assert hung_job.wait_exit(150, "the built-in timeout to end the hung repro") == 124, hung_job.output()
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
    rankscope chooses from that report: the same template and parameters, so the very program that
    just hung with that verdict on that rank (each template's own rendering is verified in
    test_repro_hangs.py)."""
    from rankscope.capabilities.launch import run_job

    job = tmp_path / "job.py"
    render_repro(template, params, out=str(job))
    run = run_job(str(job), nproc=3, hang_timeout=HANG_TIMEOUT, timeout=RUN_TIMEOUT)
    assert run.outcome == "hung" and run.stacks is not None, run.summary
    assert run.stacks.verdict.suspect_ranks == [suspect], run.stacks.verdict
    assert run.stacks.verdict.kind == next(
        t.symptom for t in list_templates().templates if t.name == template
    )
    again = repro_from_report(run, out=str(tmp_path / "repro.py"))
    assert again.template == template, again.reasons
    assert {k: again.params[k] for k in params} == params, again.params
    assert again.script == job.read_text(), "the repro chosen from the report is not the program that hung"
