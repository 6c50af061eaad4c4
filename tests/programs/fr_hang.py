"""Gloo jobs that hang in a collective, with the flight recorder on.

``python fr_hang.py MODE DUMP_DIR`` under torchrun, MODE one of:

* ``skip``: rank 1 skips the third all_reduce (it waits for "data" instead);
* ``shape``: rank 1 broadcasts with a tensor of a different shape (gloo does not notice);
* ``swap``: rank 1 calls broadcast then all_reduce, the others all_reduce then broadcast.

Every rank marks ``rank<R>`` ready just before its hanging call; rank 1 is the culprit.
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready

from rankscope.probe.flight import enable_flight_recorder


def main() -> None:
    mode, dump_dir = sys.argv[1], sys.argv[2]
    enable_flight_recorder(dump_dir)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    if mode == "skip":
        if rank == 1:
            mark_ready(f"rank{rank}")
            threading.Event().wait()  # "waiting for data": never enters the all_reduce
        mark_ready(f"rank{rank}")
        dist.all_reduce(t)
    elif mode == "shape":
        # Rank 1 receives the broadcast into a bigger buffer: gloo completes it silently
        # (a bigger all_reduce would abort the process instead), and the ranks go on with
        # different data. The recorder keeps the evidence.
        x = torch.ones(8 if rank == 1 else 4)
        dist.broadcast(x, 0)
        mark_ready(f"rank{rank}")
        threading.Event().wait()
    elif mode == "swap":
        mark_ready(f"rank{rank}")
        if rank == 1:
            dist.broadcast(t, 0)
            dist.all_reduce(t)
        else:
            dist.all_reduce(t)
            dist.broadcast(t, 0)
    # should not be reached while the peers disagree
    dist.barrier()
    threading.Event().wait()


if __name__ == "__main__":
    main()
