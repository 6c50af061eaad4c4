"""A dead job whose one rank left no traceback: triage names the rank, the collective the others
timed out in, and the blocking call the code has the silent rank pass before it (real 4-rank gloo
jobs that die by their own timeout, then the logs and the script read after the fact).

Both jobs run at once (one module-scoped pair) to keep the wall time low on a small machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope.analysis.sizing.bound import bound_triage
from rankscope.capabilities.triage import triage_logs
from rankscope.render.answer import shape_answer
from tests.jobs import PROGRAMS, JobFactory, RunningJob, wait_for

SCRIPT = PROGRAMS / "silent_rank.py"
TIMEOUT_S = "12"


def _line(text: str) -> int:
    """The line of silent_rank.py that holds ``text`` (the tests never hard-code line numbers)."""
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def _collective(function: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    start = next(n for n, line in enumerate(lines, 1) if line.startswith(f"def {function}("))
    return next(n for n, line in enumerate(lines, 1) if n > start and "dist.all_reduce(total)" in line)


@pytest.fixture(scope="module")
def dead(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningJob]]:
    factory = JobFactory(tmp_path_factory.mktemp("silent-live"))
    try:
        env = {"JOB_TIMEOUT_S": TIMEOUT_S, "SILENT_RANK": "1"}
        jobs = {
            mode: factory.torchrun("silent_rank.py", nproc=4, args=[mode], env=env)
            for mode in ("queue", "short")
        }
        wait_for(
            lambda: all(j.proc.poll() is not None for j in jobs.values()),
            240,
            "both jobs to die",
            detail=lambda: "; ".join(
                f"{m}: {j.last_output()}" for m, j in jobs.items() if j.proc.poll() is None
            ),
        )
        yield jobs
    finally:
        factory.cleanup()


def _log_dir(job: RunningJob, tmp: Path, text_from: str = "", text_to: str = "") -> Path:
    """The job's log alone in a folder, as the scheduler leaves it (paths in it rewritten when asked)."""
    assert job.proc.returncode not in (None, 0), job.output()
    folder = tmp / job.log_path.stem
    folder.mkdir()
    log = job.output().replace(text_from, text_to) if text_from else job.output()
    (folder / "torchrun.log").write_text(log)
    return folder


def test_queue_never_filled_names_the_rank_and_its_get(dead: dict[str, RunningJob], tmp_path: Path) -> None:
    folder = _log_dir(dead["queue"], tmp_path)
    r = triage_logs([str(folder)])
    assert r.suspect_ranks == [1] and r.victim_ranks == [0, 2, 3]
    where = f"{SCRIPT}:{_collective('train_queue')} in train_queue"
    assert r.summary.startswith(
        f"Rank 1 left no traceback while ranks 0,2-3 timed out in the collective at {where}"
    )
    get = _line("batch = batches.get()")
    assert r.blocking_calls and r.blocking_calls[0].startswith(f":{get} `batch = batches.get()`")
    said = r.blocking_calls[0]
    assert "no timeout" in said and "filled by thread read_source" in said
    assert f"after its own wait at :{_line('source.wait()')} `source.wait()`" in said
    # the logs alone name the silent rank, but neither the line nor what it waits on
    alone = triage_logs([str(folder)], read_code=False)
    assert alone.suspect_ranks == [1] and not alone.blocking_calls and str(get) not in alone.summary
    text, _ = shape_answer(bound_triage(r))
    assert text.startswith("verdict: Rank 1 left no traceback") and f":{get} `batch = batches.get()`" in text


def test_short_shard_names_the_get_behind_the_helper(dead: dict[str, RunningJob], tmp_path: Path) -> None:
    """The job ran elsewhere (its traceback names a path this host lacks): the script given beside
    the logs is read in its place, and without it the answer says to pass it."""
    elsewhere = "/srv/jobs/train-42/silent_rank.py"
    folder = _log_dir(dead["short"], tmp_path, str(SCRIPT), elsewhere)
    missing = triage_logs([str(folder)])
    assert missing.suspect_ranks == [1] and not missing.blocking_calls
    assert "its code is not on this host: pass the script too" in missing.summary
    r = triage_logs([str(folder), str(SCRIPT)])
    assert r.suspect_ranks == [1]
    assert f"at {elsewhere}:{_collective('train_short')} in train_short" in r.summary
    get, via = _line("return q.get()"), _line("total += next_batch(ready)")
    (said,) = r.blocking_calls
    assert said.startswith(f":{get} `return q.get()` (via :{via} `total += next_batch(ready)`)")
    assert "filled by thread prefetch" in said and "no more once `shard` ends" in said
    assert any(s.kind == "source" and s.path == str(SCRIPT) for s in r.sources)
