"""A data-parallel regression job on CPU (gloo): DDP, each rank's shard of the training records,
validation every few steps after a warm-up, early stopping, a final barrier and a checkpoint;
started by torchrun over two nodes.

Benchmark incident ``live_multinode_two_jobs`` (job A): the agent is told only that it hangs.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 32
BATCH = 32
WARMUP_STEPS = 200
EVAL_EVERY = 50
TARGET_VAL_LOSS = 0.5


def validation_set(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the validation records (1024 of them, split in order)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(1024, FEATURES, generator=g)
    noise = torch.randn(1024, 1, generator=g)
    noise[768:] *= 0.1  # the last quarter comes from the cleaner labelling run
    y = x[:, :1] * 0.05 + noise
    per = 1024 // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def validate(model: nn.Module, val: tuple[torch.Tensor, torch.Tensor]) -> float:
    model.eval()
    with torch.no_grad():
        loss = nn.functional.mse_loss(model(val[0]), val[1])
    model.train()
    return float(loss)


def save(model: nn.Module, step: int) -> None:
    path = os.path.join(tempfile.gettempdir(), f"early_stop_{os.getpid()}_{step}.pt")
    torch.save(model.state_dict(), path)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(hours=3))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    val = validation_set(rank, world)
    g = torch.Generator().manual_seed(rank)
    step = 0
    for step in range(1, 10**6):
        x = torch.randn(BATCH, FEATURES, generator=g)
        y = x[:, :1] * 0.05 + torch.randn(BATCH, 1, generator=g)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step >= WARMUP_STEPS and step % EVAL_EVERY == 0:
            val_loss = validate(model, val)
            if rank == 0:
                print(f"step {step} val {val_loss:.4f}", flush=True)
            if val_loss < TARGET_VAL_LOSS:
                break
    dist.barrier()  # every rank has finished training
    if rank == 0:
        save(model, step)
        print(f"done at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
