"""A rank-0-only checkpoint that holds a collective (gloo, CPU, any world size).

At the last step rank 0 saves a checkpoint under ``if rank == 0:``, and the save waits in a
barrier; the other ranks go on to the step's all_reduce. Each rank marks ``rank<R>`` ready
just before it blocks.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def save_checkpoint(step: int) -> None:
    dist.barrier()  # "wait until every rank has flushed": only rank 0 ever gets here


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    t = torch.ones(4)
    for step in range(3):
        if step == 2:
            mark_ready(f"rank{rank}")
            if rank == 0:
                save_checkpoint(step)
        dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
