"""A gloo job where one rank holds much more host memory than the others.

Each rank starts one child process (standing in for a DataLoader worker),
the heavy rank allocates and touches ``--extra-mb`` MiB, every rank writes
``rankscope.probe.memory_report()`` to ``$RANKSCOPE_TEST_READY/../report-rank<R>.json``,
marks itself ready and then waits to be inspected (until killed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _common import mark_ready

from rankscope.probe import memory_report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heavy-rank", type=int, default=1)
    ap.add_argument("--extra-mb", type=int, default=400)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    hold = None
    if rank == args.heavy_rank:
        hold = torch.ones(args.extra_mb * 1024 * 1024 // 4, dtype=torch.float32)  # touched: resident
    dist.barrier()
    report = memory_report()
    Path(args.out, f"report-rank{rank}.json").write_text(report.model_dump_json())
    mark_ready(f"rank{rank}")
    # Stay alive (holding ``hold``) to be inspected; the test reaps the job. The stand-in
    # worker exits on its own when this rank dies and its stdin pipe closes.
    while hold is None or hold.numel() > 0:
        time.sleep(0.2)
    worker.kill()


if __name__ == "__main__":
    main()
