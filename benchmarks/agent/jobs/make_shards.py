"""Writes live_multinode_loader's data/ folder (run in the job's folder before it starts, never
shown to the agent): 4 ranks x 64 parts of 32 records each. Rank 2's part 37 is a named pipe, as a
streaming export leaves the part it was writing when its writer dies: opening it blocks forever."""

from __future__ import annotations

import os

import torch

FEATURES = 32
os.makedirs("data", exist_ok=True)
g = torch.Generator().manual_seed(7)
for rank in range(4):
    for part in range(64):
        path = os.path.join("data", f"part-{rank:02d}-{part:03d}.bin")
        if (rank, part) == (2, 37):
            os.mkfifo(path)
            continue
        x = torch.randn(32, FEATURES, generator=g)
        y = x[:, :1] * 0.05 + torch.randn(32, 1, generator=g)
        with open(path, "wb") as fh:
            fh.write(torch.cat([x, y], dim=1).numpy().tobytes())
