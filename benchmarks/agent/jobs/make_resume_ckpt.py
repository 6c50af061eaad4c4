"""Writes live_gloo_rank_drift's ckpt/ folder (run in the job's folder before it starts, never shown
to the agent): the per-rank checkpoint of a 4-rank run of train_resume.py's model that reached step
5000, in which rank 3's saves at steps 4000 and 5000 never happened, so its file is still the one of
step 3000, written two hours before the others'. The run is replayed in one process: DDP averages
the four ranks' gradients, which is the gradient of the mean of their losses, so ranks 0-2 hold the
same weights and optimizer state, as under DDP; each rank keeps its own RNG state.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from torch import nn

FEATURES, BATCH, WORLD = 16, 32, 4
CKPT = Path("ckpt")


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * WORLD + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, torch.sin(x[:, :4].sum(1, keepdim=True))


def state(model: nn.Module, opt: torch.optim.Optimizer, rank: int) -> dict[str, object]:
    torch.manual_seed(1000 + rank)  # each rank's own generator, as each rank draws its own dropout/noise
    return {"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state()}


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    CKPT.mkdir(exist_ok=True)
    for step in range(5000):
        losses = [nn.functional.mse_loss(model(x), y) for x, y in (batch(r, step) for r in range(WORLD))]
        opt.zero_grad(set_to_none=True)
        torch.stack(losses).mean().backward()
        opt.step()
        if step + 1 == 3000:
            torch.save(state(model, opt, 3), CKPT / "rank3.pt")
    for rank in range(3):
        torch.save(state(model, opt, rank), CKPT / f"rank{rank}.pt")
    (CKPT / "latest.json").write_text(json.dumps({"step": 5000}))
    now = time.time()
    os.utime(CKPT / "rank3.pt", (now - 7200, now - 7200))


if __name__ == "__main__":
    main()
