#!/usr/bin/env bash
# Run every benchmark in one go on a quiet machine; each writes its table to benchmarks/results/.
# Ratios, not seconds, are the results: each script measures rankscope side by side with its
# baseline in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
$PY benchmarks/bench_stacks.py --repeats 3 --out benchmarks/results/stacks.md
$PY benchmarks/bench_window.py --repeats 3 --out benchmarks/results/window.md
$PY benchmarks/bench_mcp.py --out benchmarks/results/mcp.md
$PY benchmarks/bench_answers.py                # writes benchmarks/results/answers.md
$PY benchmarks/bench_triage.py --mb 200 --out benchmarks/results/triage.md
$PY benchmarks/bench_redact.py --out benchmarks/results/redact.md
$PY benchmarks/bench_consistency.py            # writes benchmarks/results/consistency.md
$PY benchmarks/bench_remote.py --out benchmarks/results/remote.md
$PY benchmarks/bench_watch.py --repeats 5 --window 15 --out benchmarks/results/watch.md
$PY benchmarks/bench_memory.py --sizes 50,500 --data "${RANKSCOPE_BENCH_DATA:-/tmp/rankscope-bench-memory}" --out benchmarks/results/memory.md
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
