"""A job whose steps are short and regular (torchrun, gloo, CPU), for measuring what a watch
beside it costs: each step computes a little (a forward and backward of a small MLP), all-reduces
its gradients, and waits ``--wait`` seconds (the data loader's share of a step). Rank 0 prints
``step N t=EPOCH`` after every step, so the step time is taken inside the job, not by whoever
watches it. Each rank marks ``up-rank<R>`` ready after ``--warm`` steps.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wait", type=float, default=0.05)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--warm", type=int, default=5)
    a = ap.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(a.width, a.width), nn.Tanh(), nn.Linear(a.width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(1, 10**9):
        x = torch.randn(64, a.width, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
        opt.step()
        if rank == 0:
            print(f"step {step} t={time.time():.6f}", flush=True)
        if step == a.warm:
            mark_ready(f"up-rank{rank}")
        time.sleep(a.wait)


if __name__ == "__main__":
    main()
