"""DDP on gloo: rank ``--odd`` skips backward on the last step (say, a NaN-loss guard) and
goes on to an end-of-epoch barrier, while the other ranks wait inside loss.backward() for
the Reducer's gradient all-reduce - which Python frames show only as Tensor.backward."""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--odd", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(a.steps):
        loss = model(torch.ones(4, 8)).sum()
        last = step == a.steps - 1
        if last:
            mark_ready(f"rank{rank}")
        if last and rank == a.odd:
            continue  # "skip this batch": no backward, no gradient all-reduce
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
