"""A small data-parallel job on CPU (gloo) that trains steadily: DDP, a step every half second,
started by torchrun over two nodes.

Benchmark incident ``live_multinode_two_jobs`` (job B): it runs fine beside job A.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(hours=3))
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(1, 10**7):
        x = torch.randn(16, 16, generator=g)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.5)  # waits on the data service in the real job


if __name__ == "__main__":
    main()
