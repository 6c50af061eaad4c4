"""What the progress window costs: one `rankscope stacks` call on an 8-rank job, a single look
(``--window 0``) beside the default window, in the same run and alternating.

    .venv/bin/python benchmarks/bench_window.py [--repeats 5] [--out benchmarks/results/window.md]

Two real 8-rank gloo jobs are started once: a hung one (tests/programs/hang_collectives.py
--mode mismatch: seven ranks in all_reduce, one in barrier) and a healthy one
(tests/programs/progress_jobs.py --mode healthy). Each call is a fresh process (interpreter
start, discovery, capture, analysis, JSON). Medians are reported, and the ratio default /
single look. The verdicts are printed too: the single look calls the healthy job hung or
inconclusive, the window calls it progressing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.jobs import JobFactory  # noqa: E402

from rankscope.capabilities.discovery import find_job  # noqa: E402

RANKSCOPE = str(Path(sys.executable).parent / "rankscope")


def one_call(pid: int, window: str | None) -> tuple[float, str]:
    """(wall seconds, verdict kind) of one `rankscope stacks --pid PID --json [--window W]`."""
    argv = [RANKSCOPE, "stacks", "--pid", str(pid), "--json", *(["--window", window] if window else [])]
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{argv} failed: {out.stderr[-500:]}")
    return wall, str(json.loads(out.stdout)["verdict"]["kind"])


def wait_ranks(pid: int, n: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if len(find_job(pid).ranks) == n:
                return
        except Exception:  # the job is still starting: no ranks yet
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{n} ranks of {pid} not found")


def measure(pid: int, repeats: int) -> dict[str, tuple[float, set[str]]]:
    times: dict[str, list[float]] = {"single look (--window 0)": [], "default window": []}
    kinds: dict[str, set[str]] = {k: set() for k in times}
    for _ in range(repeats):
        for label, window in (("single look (--window 0)", "0"), ("default window", None)):
            wall, kind = one_call(pid, window)
            times[label].append(wall)
            kinds[label].add(kind)
    return {k: (statistics.median(v), kinds[k]) for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "window.md")
    a = p.parse_args()
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        factory = JobFactory(Path(tmp))
        try:
            jobs = {
                "8 hung ranks": factory.torchrun(
                    "hang_collectives.py", nproc=8, args=["--mode", "mismatch", "--odd", "7"]
                ),
                "8 healthy ranks": factory.torchrun("progress_jobs.py", nproc=8, args=["--mode", "healthy"]),
            }
            for name, job in jobs.items():
                job.wait_ready(timeout=300)
                wait_ranks(job.pid, 8)
                res = measure(job.pid, a.repeats)
                (one, one_kinds), (win, win_kinds) = res.values()
                rows.append(
                    f"| {name} | {one:.2f} s ({', '.join(sorted(one_kinds))}) | {win:.2f} s "
                    f"({', '.join(sorted(win_kinds))}) | **{win / one:.2f}×** |"
                )
        finally:
            factory.cleanup()
    table = "\n".join(
        [
            f"# Progress window cost ({time.strftime('%Y-%m-%d')}, {a.repeats} alternating calls each, medians)",
            "",
            "| job | single look: time (verdicts) | default window: time (verdicts) | ratio |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
