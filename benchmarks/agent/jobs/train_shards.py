"""A data-parallel regression job on CPU (gloo): DDP, each rank reading its own pre-batched shard
parts from the job's data/ folder through a DataLoader with two workers; started by torchrun over
two nodes.

Benchmark incident ``live_multinode_loader``: the agent is told only that it hangs.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

FEATURES = 32
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


class ShardParts(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """One rank's parts of the exported training set: each part is one batch, stored as raw float32."""

    def __init__(self, rank: int) -> None:
        self.paths = sorted(
            os.path.join(DATA, name) for name in os.listdir(DATA) if name.startswith(f"part-{rank:02d}-")
        )

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        with open(self.paths[i], "rb") as part:
            raw = part.read()
        rows = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(-1, FEATURES + 1)
        return rows[:, :FEATURES], rows[:, FEATURES:]


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(hours=3))
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loader = DataLoader(ShardParts(rank), batch_size=None, num_workers=2, persistent_workers=True)
    step = 0
    for epoch in range(100):
        for x, y in loader:
            step += 1
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if rank == 0 and step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
