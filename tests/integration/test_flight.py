"""Flight recorder: real gloo hangs dumped through the probe, NCCL-layout dumps, bad files.

The tests here start processes; the pure ones are in tests/unit/test_flight.py.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from rankscope.capabilities.recorder.flight import analyze_flight_recorder
from tests.jobs import JobFactory, wait_for
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "flight"

CASES = {
    # mode: (verdict kind, first mismatch kind, rank whose main thread is stuck in all_reduce)
    "skip": ("divergent_ranks", "not_entered", 0),
    "swap": ("mismatched_collectives", "op_mismatch", 0),
    "shape": ("mismatched_collectives", "size_mismatch", None),
}


def _signal_until_dumped(pids: list[int], dump: Path, nranks: int, timeout: float = 60.0) -> None:
    """SIGUSR1 every rank, then wait for every rank's trace (re-signal a slow starter every 5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        try:
            wait_for(
                lambda: all(
                    (dump / f"fr_trace_rank_{r}").exists() and (dump / f"stacks_rank_{r}.txt").exists()
                    for r in range(nranks)
                ),
                timeout=min(5.0, max(0.1, deadline - time.monotonic())),
                what="flight-recorder dumps",
            )
            return
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise


def _rank_pids(job: object) -> list[int]:
    pids = []
    for pid in job.rank_pids():  # type: ignore[attr-defined]
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"fr_hang.py" in cmd:
            pids.append(pid)
    return pids


@pytest.mark.slow
def test_real_gloo_hangs_dumped_by_probe(jobs: JobFactory, tmp_path: Path) -> None:
    # The three jobs start together: most of each start is waiting, not computing.
    started = {
        mode: jobs.torchrun("fr_hang.py", nproc=2, args=[mode, str(tmp_path / mode)]) for mode in CASES
    }
    for mode, job in started.items():
        job.wait_ready(["rank0", "rank1"], timeout=120)
        pids = _rank_pids(job)
        assert len(pids) == 2, job.output()
        _signal_until_dumped(pids, tmp_path / mode, 2)
        assert job.proc.poll() is None, "SIGUSR1 must not kill the ranks"

    for mode, (kind, mismatch, stuck_rank) in CASES.items():
        dump = tmp_path / mode
        if stuck_rank is not None:
            # The dump was written while this rank's main thread sat inside the gloo all_reduce:
            # the proof that the wakeup-fd thread works where a Python signal handler cannot run.
            sections = (dump / f"stacks_rank_{stuck_rank}.txt").read_text().split("\n\n")
            main_thread = next(sec for sec in sections if "fr_hang.py" in sec and " in main" in sec)
            assert not main_thread.lstrip().startswith("Current thread"), main_thread
            assert "distributed_c10d.py" in main_thread and " in all_reduce" in main_thread, main_thread

        report = analyze_flight_recorder([str(dump)])
        assert report.ranks == [0, 1] and report.errors == [], mode
        assert report.verdict.kind == kind, (mode, report.verdict)
        assert report.verdict.suspect_ranks == [1], mode
        assert report.first_mismatch is not None
        assert report.first_mismatch.kind == mismatch, mode
        assert report.first_mismatch.seq_id == 3
        # Gloo's pg_config has an empty name: repaired from the entries.
        assert any("empty name" in r for d in report.dumps for r in d.repaired)
        sites = {e.call_site.file for e in report.first_mismatch.entries if e.call_site}
        assert sites and all(s.endswith("fr_hang.py") for s in sites)
