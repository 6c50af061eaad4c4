"""Benchmark: analysing a large CUDA memory snapshot, time and peak RSS against file size.

Generates snapshots in the ``_dump_snapshot`` layout (shared frame dicts, as
torch's symbolizer produces them, so pickle memoizes them like a real dump)
and measures, each in a fresh process, side by side on the same file:

* ``pickle.load``            just reading the file, as ``_memory_viz`` and most scripts do;
* ``pickle.load, gc paused`` the floor: reading it with the cyclic GC paused (as rankscope does);
* ``rankscope``              restricted load + ``analyze_snapshot`` (the ``rankscope memory`` path);
* ``rankscope, by phase``    the same steps timed one by one: imports, load, analysis, freeing the snapshot;
* ``torch _memory_viz``      torch's own text summaries of the same file (``segsum`` + ``trace``).

Usage: ``python benchmarks/bench_memory.py [--sizes 50,500] [--data DIR] [--out FILE]``
(``--data`` keeps the generated snapshots there and reuses them on the next run.)
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent

MEASURE = r"""
import json, os, pickle, sys, time
path, mode = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
c0 = time.process_time()
if mode == "pickle.load":
    with open(path, "rb") as fh:
        data = pickle.load(fh)
    detail = f"{len(data['device_traces'][0])} trace entries"
elif mode == "pickle.load, gc paused":
    import gc
    gc.disable()
    with open(path, "rb") as fh:
        data = pickle.load(fh)
    detail = f"{len(data['device_traces'][0])} trace entries"
elif mode == "rankscope":
    from rankscope.capabilities.memory import analyze_snapshot_files
    r = analyze_snapshot_files([path], top=10)
    s = r.snapshots[0]
    detail = f"peak {s.peak_allocated_bytes >> 20} MiB, {len(s.top_sites)} sites, {len(s.leak_suspects)} leak suspects"
elif mode == "rankscope, by phase":
    from rankscope.capabilities import memory as m
    from rankscope.analysis import memory as am
    be, ff = m._torch_helpers()
    with m.gc_paused():
        c1 = time.process_time()
        data = m.load_snapshot(path)
        c2 = time.process_time()
        s = am.analyze_snapshot(data, path, 0, top=10, block_extra=be, frame_filter=ff)
        c3 = time.process_time()
        del data
        c4 = time.process_time()
    detail = f"CPU: imports {c1 - c0:.2f} s, load {c2 - c1:.2f} s, analysis {c3 - c2:.2f} s, free {c4 - c3:.2f} s"
else:
    from torch.cuda import _memory_viz as mv
    with open(path, "rb") as fh:
        data = pickle.load(fh)
    text = mv.segsum(data)
    text2 = mv.trace(data)
    detail = f"{len(text) + len(text2)} chars of text"
elapsed = time.perf_counter() - t0
cpu = time.process_time() - c0
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent's memory.
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
print(json.dumps({"seconds": elapsed, "cpu_seconds": cpu, "peak_rss": int(hwm) * 1024, "detail": detail}))
"""


def generate(path: Path, target_mb: int, seed: int = 0) -> int:
    """Write a snapshot of about ``target_mb`` MiB; returns its size in bytes."""
    rnd = random.Random(seed)
    files = [f"/work/job/model/part{i}.py" for i in range(40)] + [
        "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
        "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py",
    ]
    pool = [
        {"filename": rnd.choice(files), "line": rnd.randrange(1, 2000), "name": f"fn_{i}"}
        for i in range(4000)
    ]
    cpp = [
        {"filename": "??", "line": 0, "name": f"c10::cuda::CUDACachingAllocator::frame{i}"} for i in range(50)
    ]
    stacks = [cpp[:6] + rnd.sample(pool, 24) for _ in range(3000)]
    # about 125 bytes of pickle per trace entry with a 30-deep stack of shared frames
    entries = max(1000, target_mb * MiB // 125)
    trace: list[dict[str, Any]] = []
    live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    addr = 0x7F0000000000
    t = 1_700_000_000_000_000
    seg_size = 2 * 1024 * MiB
    trace.append(
        {"action": "segment_alloc", "addr": addr, "size": seg_size, "stream": 0, "time_us": t, "frames": []}
    )
    free_addrs: list[int] = []
    next_addr = addr
    for _i in range(entries):
        t += 3
        if live and (rnd.random() < 0.48 or len(live) > 20000):
            a = rnd.choice(list(live)) if len(live) < 64 else next(iter(live))
            size, _ = live.pop(a)
            trace.append(
                {"action": "free_completed", "addr": a, "size": size, "stream": 0, "time_us": t, "frames": []}
            )
            free_addrs.append(a)
        else:
            size = rnd.choice((512, 4096, 65536, 1 * MiB, 4 * MiB))
            a = next_addr
            next_addr += 4 * MiB  # never reused: every alloc has its own address
            frames = list(rnd.choice(stacks))
            live[a] = (size, frames)
            trace.append(
                {"action": "alloc", "addr": a, "size": size, "stream": 0, "time_us": t, "frames": frames}
            )
    blocks: list[dict[str, Any]] = [
        {"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": f}
        for a, (s, f) in sorted(live.items())
    ]
    used = sum(b["size"] for b in blocks)
    free = 256 * MiB
    seg_size = used + free  # one segment holding every live block, then a free tail: consistent accounting
    trace[0]["size"] = seg_size
    blocks.append(
        {"address": addr + used, "size": free, "requested_size": 0, "state": "inactive", "frames": []}
    )
    snapshot = {
        "segments": [
            {
                "device": 0,
                "address": addr,
                "total_size": seg_size,
                "allocated_size": used,
                "active_size": used,
                "requested_size": used,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        ],
        "device_traces": [trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
    }
    with open(path, "wb") as fh:
        pickle.dump(snapshot, fh)
    return path.stat().st_size


def measure(path: Path, mode: str) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "tools"))
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), mode], capture_output=True, text=True, env=env, timeout=900
    )
    if out.returncode != 0:
        return {
            "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        }
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50,500", help="snapshot sizes in MiB, comma separated")
    ap.add_argument(
        "--modes",
        default="pickle.load;pickle.load, gc paused;rankscope;rankscope, by phase;torch _memory_viz",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="also write the table to this file (results: benchmarks/results/memory.md)",
    )
    ap.add_argument("--data", default=None, help="directory to keep (and reuse) the generated snapshots")
    args = ap.parse_args()
    modes = args.modes.split(";")
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(args.data) if args.data else Path(tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        for mb in (int(x) for x in args.sizes.split(",")):
            path = data_dir / f"snapshot-rank0-{mb}.pickle"
            if not path.exists():
                # in a child, so that this process stays small while the readers are measured
                t0 = time.perf_counter()
                code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_memory as b; from pathlib import Path; b.generate(Path({str(path)!r}), {mb})"
                subprocess.run([sys.executable, "-c", code], check=True, timeout=3600)
                print(f"generated in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
            size = path.stat().st_size
            print(f"{path.name}: {size / MiB:.0f} MiB", file=sys.stderr)
            base: dict[str, Any] | None = None
            for mode in modes:
                r = measure(path, mode)
                print(f"  {mode}: {r}", file=sys.stderr)
                if "error" in r:
                    rows.append(f"| {size / MiB:.0f} MiB | {mode} | failed: {r['error']} | | | | | |")
                    continue
                base = base or r
                rows.append(
                    f"| {size / MiB:.0f} MiB | {mode} | {r['cpu_seconds']:.1f} s | {r['seconds']:.1f} s "
                    f"| {r['cpu_seconds'] / base['cpu_seconds']:.2f}x "
                    f"| {r['peak_rss'] / MiB:.0f} MiB | {r['peak_rss'] / size:.1f}x | {r['detail']} |"
                )
            if not args.data:
                path.unlink()
    table = "\n".join(
        [
            "| snapshot | reader | CPU time | wall time | CPU time vs pickle.load | peak RSS | peak RSS / file size | result |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
