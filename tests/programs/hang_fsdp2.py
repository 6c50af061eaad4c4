"""FSDP2 (fully_shard) on gloo: rank ``--odd`` skips the forward of the last step (say, an empty
batch) and goes on to a barrier, while the other ranks wait in forward for FSDP2's parameter
all-gather (unshard) that rank ``--odd`` never joins."""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready
from torch.distributed.fsdp import fully_shard


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--odd", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(a.steps):
        last = step == a.steps - 1
        if last:
            mark_ready(f"rank{rank}")
        if last and rank == a.odd:
            continue  # "empty batch": this rank skips the step
        model(torch.ones(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
