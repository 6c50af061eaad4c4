"""Data-parallel training on image shards, CPU (gloo), started by torchrun.

Benchmark incident ``live_gloo_slow``: the agent is told only that the job seems stuck or very slow.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

SHARD_SIDE = {0: 64, 1: 64, 2: 448, 3: 64}
"""Pixels per side of each rank's shard (as the shards were written to disk)."""


def load_batch(rank: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    side = SHARD_SIDE[rank % len(SHARD_SIDE)]
    images = torch.rand(16, 1, side, side, generator=g)
    for _ in range(4):  # decode and augment
        images = (images * 0.9 + 0.05).clamp(0, 1)
    return F.adaptive_avg_pool2d(images, 16).flatten(1), torch.randint(0, 10, (16,), generator=g)


def train() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10**7):
        x, y = load_batch(rank, g)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
        opt.step()
        if step % 50 == 0:
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    train()
