"""`rankscope stacks --native` on 8 hung ranks, this checkout beside another, and both beside py-spy.

    .venv/bin/python benchmarks/bench_native.py --before /path/to/other/tools [--rounds 8]

A single ``--native`` look is CPU-bound (each py-spy loads libtorch's symbols), so on a shared
machine its seconds swing with the load more than with any change. This script takes a change's
measure the way bench_stacks.py takes rankscope's: in one run, interleaved. One real 8-rank gloo
job hung in a collective (tests/programs/hang_collectives.py --mode mismatch --odd 7) is started
once; each round runs, in an order that rotates from round to round,

* a fresh ``rankscope stacks --pid LAUNCHER --json --window 0 --native`` from this checkout's tools,
* the same from ``--before`` (another checkout's ``tools`` folder, e.g. one made by
  ``git worktree add /tmp/before HEAD~1``; more as ``--also NAME=PATH``),
* ``py-spy dump --json --native`` over the 8 ranks one after another;

and reports each one's median wall time, its ratio to the sequential loop (the ratio of medians,
and the median of each round's ratio: both taken beside the same loop), its CPU, and whether
every tree gave the same verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
from rankscope.runtime.pyspy import find_pyspy  # noqa: E402


def run_once(argvs: list[list[str]], env: dict[str, str] | None) -> tuple[float, float, bytes]:
    """(wall s, CPU s of the commands and their children, the last one's stdout) for running them in turn."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = b""
    for argv in argvs:
        done = subprocess.run(argv, capture_output=True, timeout=600, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{argv} failed: {done.stderr.decode()[-500:]}")
        out = done.stdout
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def rounds(
    trees: dict[str, str], launcher: int, pids: list[int], n: int
) -> dict[str, list[tuple[float, float]]]:
    """``n`` rounds, each tree and the sequential loop once, the order rotating; prints each round."""
    pyspy = find_pyspy()
    names = [*trees, "sequential"]
    seen: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    verdicts: dict[str, set[str]] = {k: set() for k in trees}
    for i in range(n):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order if (i // len(names)) % 2 == 0 else reversed(order):
            if name == "sequential":
                argvs = [[pyspy, "dump", "--json", "--native", "--pid", str(p)] for p in pids]
                wall, cpu, _ = run_once(argvs, None)
            else:
                argv = [sys.executable, "-m", "rankscope", "stacks", "--pid", str(launcher), "--json"]
                env = dict(os.environ, PYTHONPATH=trees[name])
                wall, cpu, out = run_once([[*argv, "--window", "0", "--native"]], env)
                verdicts[name].add(json.loads(out)["verdict"]["summary"])
            seen[name].append((wall, cpu))
        print(
            i, {k: round(v[-1][0], 2) for k, v in seen.items()}, f"load {os.getloadavg()[0]:.1f}", flush=True
        )
    if len({frozenset(v) for v in verdicts.values()}) != 1:
        raise RuntimeError(f"the trees' verdicts differ: {verdicts}")
    return seen


def table(seen: dict[str, list[tuple[float, float]]], n: int, load: tuple[float, float]) -> list[str]:
    seq = seen.pop("sequential")
    seq_wall = statistics.median(w for w, _ in seq)
    lines = [
        "| tree | wall (s) | sequential wall (s) | ratio of medians | median of per-round ratios "
        "| per-round ratios | CPU (s) | sequential CPU (s) |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name, runs in seen.items():
        per_round = [w / s for (w, _), (s, _) in zip(runs, seq, strict=True)]
        wall = statistics.median(w for w, _ in runs)
        lines.append(
            f"| {name} | {wall:.2f} | {seq_wall:.2f} | {wall / seq_wall:.2f}× | {statistics.median(per_round):.2f}× "
            f"| {', '.join(f'{r:.2f}' for r in per_round)} | {statistics.median(c for _, c in runs):.2f} "
            f"| {statistics.median(c for _, c in seq):.2f} |"
        )
    lines.append(
        f"\n{n} rounds; load average (1 min) {load[0]:.1f} before, {load[1]:.1f} after; the verdicts were the same."
    )
    return lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--before", required=True, help="another checkout's tools folder, measured beside this one's"
    )
    p.add_argument("--also", action="append", default=[], help="NAME=PATH: one more tools folder")
    p.add_argument("--rounds", type=int, default=8)
    a = p.parse_args()
    trees = {"this checkout": str(ROOT / "tools"), "before": a.before}
    trees.update(x.split("=", 1) for x in a.also)
    factory = JobFactory(Path(tempfile.mkdtemp(prefix="bench-native-")))
    try:
        job = factory.torchrun(
            "hang_collectives.py", nproc=8, args=["--mode", "mismatch", "--odd", "7", "--pg-timeout", "3600"]
        )
        job.wait_ready(timeout=600)
        pids = [r.pid for r in sorted(find_job(job.pid).ranks, key=lambda r: r.rank or 0)]
        first = os.getloadavg()[0]
        seen = rounds(trees, job.pid, pids, a.rounds)
        print("\n".join(table(seen, a.rounds, (first, os.getloadavg()[0]))))
    finally:
        factory.cleanup()


if __name__ == "__main__":
    main()
