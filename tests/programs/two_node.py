"""One gloo job over two torchrun "nodes" (``--nnodes=2``, 2 ranks each, world 4).

Rank 3 (on node 1) never reaches the all_reduce: it waits for "data" in
``load_batch`` while ranks 0, 1 and 2 wait in the collective. Each rank marks
``rank<R>`` ready just before it blocks.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def load_batch() -> torch.Tensor:
    threading.Event().wait()  # the data never comes
    return torch.ones(4)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    mark_ready(f"rank{rank}")
    if rank == 3:
        t = load_batch()
    dist.all_reduce(t)
    threading.Event().wait()


if __name__ == "__main__":
    main()
