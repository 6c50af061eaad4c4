"""Pairs [0,1] and [2,3] all-reduce in their own groups; rank 3 skips one of its pair's all_reduces
and goes on to the global barrier, leaving rank 2 waiting in the pair's all_reduce."""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import mark_ready


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = pairs[rank // 2]
    for step in range(3):
        t = torch.ones(2)
        if rank == 3 and step == 1:
            continue  # the skipped collective
        if step == 2 and rank == 2:
            mark_ready(f"rank{rank}")
        dist.all_reduce(t, group=mine)
    mark_ready(f"rank{rank}")
    dist.barrier()


if __name__ == "__main__":
    main()
