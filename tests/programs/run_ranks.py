"""Small gloo jobs for `rankscope run` tests: ``python run_ranks.py MODE [ARG]``.

MODE is one of:

* ``clean``: every rank prints the same lines, except one line that differs
  on rank 1 and a warning only rank 1 prints; exit 0.
* ``crash R``: rank R exits with status 3 after its first collective; the
  peers then block in the next collective until torchrun stops them.
* ``kill R``: rank R kills itself with SIGKILL after its first collective.
* ``hang``: rank 1 skips an all_reduce and waits in a barrier while the other
  ranks wait in the all_reduce (mismatched collectives); no rank ever exits.
* ``quiet``: prints once, then every rank sleeps without printing (idle).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def _init() -> tuple[int, int]:
    backend = os.environ.get("RANKSCOPE_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend, timeout=timedelta(seconds=600))
    return dist.get_rank(), dist.get_world_size()


def clean() -> None:
    rank, world = _init()
    print(f"world size {world}")
    if rank == 1:
        print("warning: rank 1 saw an odd batch", file=sys.stderr)
    t = torch.ones(2)
    dist.all_reduce(t)
    print(f"sum {t[0].item():.1f}")
    print(f"local {1.0 if rank != 1 else 2.0}")
    dist.barrier()
    print("done")
    dist.destroy_process_group()


def crash(culprit: int) -> None:
    rank, _ = _init()
    t = torch.ones(2)
    dist.all_reduce(t)
    print(f"rank {rank} after first all_reduce")
    if rank == culprit:
        # os._exit: a plain sys.exit runs interpreter shutdown while gloo's
        # threads are live, which sometimes aborts (SIGABRT) instead of exiting 3.
        sys.stdout.flush()
        os._exit(3)
    dist.all_reduce(t)


def kill(culprit: int) -> None:
    rank, _ = _init()
    t = torch.ones(2)
    dist.all_reduce(t)
    print(f"rank {rank} after first all_reduce")
    if rank == culprit:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)


def hang() -> None:
    rank, _ = _init()
    t = torch.ones(2)
    dist.all_reduce(t)
    print("first all_reduce ok")
    mark_ready(f"rank{rank}")
    if rank == 1:
        dist.barrier()  # the culprit: skipped the all_reduce the others wait in
    else:
        dist.all_reduce(t)


def quiet() -> None:
    rank, _ = _init()
    print("started")
    mark_ready(f"rank{rank}")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "clean":
        clean()
    elif mode == "crash":
        crash(int(sys.argv[2]))
    elif mode == "kill":
        kill(int(sys.argv[2]))
    elif mode == "hang":
        hang()
    elif mode == "quiet":
        quiet()
    else:
        raise SystemExit(f"unknown mode {mode}")
