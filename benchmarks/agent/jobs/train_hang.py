"""A small data-parallel training loop on CPU (gloo), started by torchrun.

Benchmark incident ``live_gloo_hang``: the agent is told only that the job stopped printing.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist

CHECKPOINT_EVERY = 40


def save_checkpoint(model: torch.nn.Module, step: int) -> None:
    path = os.path.join(tempfile.gettempdir(), f"ckpt_{step}.pt")
    torch.save(model.state_dict(), path)
    dist.barrier()  # wait until the file is on disk before anyone reads it


def train() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 10**6):
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        if step % 10 == 0:
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if rank == 0 and step % CHECKPOINT_EVERY == 0:
            save_checkpoint(model, step)


if __name__ == "__main__":
    train()
