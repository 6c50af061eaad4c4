"""Log triage throughput on a generated multi-rank log (default ~200 MB).

Measured side by side in one run, each in a fresh subprocess (so peak RSS is its own):

* ``rankscope``: ``triage_logs([path])`` (chunked reads, needle pre-filter, rule engine);
* ``python-lines``: the obvious alternative, ``for line in open(path)`` with one combined regex;
* ``grep``: ``grep -c -F`` with the same needles, as the speed of the disk cache and a C matcher.

Usage: ``python benchmarks/bench_triage.py [--mb 200] [--out benchmarks/results/triage.md]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NORMAL = [
    "[rank{r}]: step {s} loss {l:.4f} lr 3.0e-04 tokens/s 41234 mem 61.2GiB",
    "[rank{r}]:[I1121 10:05:11.004512308 ProcessGroupNCCL.cpp:2291] [PG ID 0 PG GUID 0(default_pg) Rank {r}] ProcessGroupNCCL initialized",
    "[rank{r}]: 2026-11-21 10:05:{ss:02d} INFO dataloader: prefetching shard {s}.parquet",
    "gpu-node-0{r}:1100{r}:1120{r} [{r}] NCCL INFO Channel 00/0 : {r}[{r}] -> {n}[{n}] via P2P/CUMEM",
]
EVENTS = [
    "[rank{r}]:[E1121 10:15:12.873412007 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=26214400, NumelOut=26214400, Timeout(ms)=600000) ran for 600046 milliseconds before timing out.",
    "[rank{r}]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.{r}]:4242. This is typically caused by a remote worker crashing.",
]


def generate(path: Path, mb: int, ranks: int = 8) -> int:
    rnd = random.Random(7)
    target = mb * 1_000_000
    written = 0
    with open(path, "w") as fh:
        s = 0
        while written < target:
            lines = []
            for _ in range(5000):
                s += 1
                r = rnd.randrange(ranks)
                tmpl = EVENTS[s % 2] if s % 200_000 == 0 else NORMAL[s % len(NORMAL)]
                lines.append(tmpl.format(r=r, n=(r + 1) % ranks, s=s, l=rnd.random(), ss=s % 60))
            block = "\n".join(lines) + "\n"
            fh.write(block)
            written += len(block)
    return path.stat().st_size


RANKSCOPE = """
import json, resource, sys, time
from rankscope.capabilities.triage import triage_logs
t = time.perf_counter()
r = triage_logs([sys.argv[1]])
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "findings": len(r.findings)}))
"""

PYLINES = """
import json, re, resource, sys, time
from rankscope.analysis.triage.logs import SHELL_NEEDLES
rx = re.compile("|".join(re.escape(n) for n in SHELL_NEEDLES))
t = time.perf_counter()
hits = 0
with open(sys.argv[1], errors="replace") as fh:
    for line in fh:
        if rx.search(line):
            hits += 1
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "findings": hits}))
"""


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_py(code: str, path: Path) -> dict[str, float]:
    before = _children_cpu()
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=1800, check=True
    )
    data: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    data["cpu"] = _children_cpu() - before  # includes interpreter start-up (~0.3 s)
    return data


def run_grep(path: Path) -> dict[str, float]:
    from rankscope.analysis.triage.logs import SHELL_NEEDLES

    args = ["grep", "-c", "-F"]
    for n in SHELL_NEEDLES:
        args += ["-e", n]
    before = _children_cpu()
    t = time.perf_counter()
    subprocess.run([*args, str(path)], capture_output=True, timeout=1800)
    return {
        "seconds": time.perf_counter() - t,
        "cpu": _children_cpu() - before,
        "rss_kb": float("nan"),
        "findings": float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "triage.md"))
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "multirank.log"
        size = generate(path, args.mb)
        # warm the page cache once so every contender reads from memory
        with open(path, "rb") as fh:
            while fh.read(16 << 20):
                pass
        results = {
            "rankscope": run_py(RANKSCOPE, path),
            "python-lines": run_py(PYLINES, path),
            "grep": run_grep(path),
        }
    load_after = os.getloadavg()[0]
    mb = size / 1e6
    base = results["rankscope"]["cpu"]
    rows = [
        "| contender | wall s | CPU s | MB/s (wall) | MB/s (CPU) | peak RSS (MiB) | CPU time vs rankscope |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rss = "-" if r["rss_kb"] != r["rss_kb"] else f"{r['rss_kb'] / 1024:.0f}"
        rows.append(
            f"| {name} | {r['seconds']:.2f} | {r['cpu']:.2f} | {mb / r['seconds']:.0f} | {mb / r['cpu']:.0f} | {rss} "
            f"| {r['cpu'] / base:.2f}x |"
        )
    text = "\n".join(
        [
            "# Log triage throughput",
            "",
            f"Generated 8-rank log: {mb:.0f} MB, {os.cpu_count()} CPUs, `python benchmarks/bench_triage.py --mb {args.mb}`. "
            "Page cache warm; each contender in its own process. Target: rankscope at least 50 MB/s. "
            "The CPU column is the process's own CPU time: on a shared machine (other jobs running) wall time "
            "overstates the cost, so compare contenders by CPU time.",
            "",
            *rows,
            "",
            f"rankscope findings: {results['rankscope']['findings']}. Load average (1 min) before/after: "
            f"{load_before:.1f}/{load_after:.1f} on {os.cpu_count()} CPUs.",
            "",
        ]
    )
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
