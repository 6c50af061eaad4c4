"""torch.multiprocessing.spawn launch (ranks have no RANK variable): rank ``--odd`` calls
barrier() while the others all_reduce. Rank 0 keeps a forked DataLoader worker alive,
a child with the same command line as a rank that must not be taken for one."""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import mark_ready


def worker(index: int, world: int, odd: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=index,
        world_size=world,
        timeout=timedelta(seconds=600),
    )
    keep = None
    if index == 0:
        data = torch.utils.data.TensorDataset(torch.ones(16, 2))
        keep = iter(torch.utils.data.DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True))
        next(keep)
    mark_ready(f"rank{index}")
    if index == odd:
        dist.barrier()
    else:
        dist.all_reduce(torch.ones(2))
    del keep


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--odd", type=int, default=1)
    a = p.parse_args()
    mp.spawn(worker, args=(a.nproc, a.odd), nprocs=a.nproc)


if __name__ == "__main__":
    main()
