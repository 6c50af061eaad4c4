"""A data-parallel regression job on CPU (gloo): DDP, Adam, resumed from the checkpoint in ckpt/,
where each rank keeps its own file (weights, optimizer state, RNG state) and rank 0 the step it
reached (latest.json); four ranks started by torchrun. Every rank prints its loss, its evaluation
loss and the norm of its weights every 20 steps, and saves its file every 5000 steps.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CKPT = Path("ckpt")
FEATURES = 16
BATCH = 32
SAVE_EVERY = 5000


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def batch(rank: int, world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * world + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, torch.sin(x[:, :4].sum(1, keepdim=True))


def save(model: nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> None:
    """Each rank's own file, written whole then renamed; rank 0 records the step."""
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state()}
    tmp = CKPT / f".rank{rank}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, CKPT / f"rank{rank}.pt")
    if rank == 0:
        (CKPT / "latest.json").write_text(json.dumps({"step": step}))


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = build_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = int(json.loads((CKPT / "latest.json").read_text())["step"])
    state = torch.load(CKPT / f"rank{rank}.pt", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng"])
    ddp = DistributedDataParallel(model)
    eval_x, eval_y = batch(world, 1, 10**9)  # the same held-out batch on every rank
    print(f"rank {rank}: resumed at step {step}", flush=True)
    while True:
        x, y = batch(rank, world, step)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 20 == 0:
            with torch.no_grad():
                ev = nn.functional.mse_loss(model(eval_x), eval_y).item()
                norm = torch.cat([p.reshape(-1) for p in model.parameters()]).norm().item()
            print(f"rank {rank} step {step} loss {loss.item():.4f} eval {ev:.6f} |w| {norm:.6f}", flush=True)
        if step % SAVE_EVERY == 0:
            save(model, opt, rank, step)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
