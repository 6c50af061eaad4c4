"""A data-parallel regression job on CPU (gloo): DDP, a DistributedSampler over feature records,
a guard that skips a batch whose loss is not finite, a checkpoint and a barrier after each epoch;
four ranks started by torchrun.
"""

from __future__ import annotations

import math
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

RECORDS = 2048
BATCH = 16
FEATURES = 48


class FeatureRecords(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Feature vectors as the upstream job exported them (one of them with a value out of range)."""

    def __len__(self) -> int:
        return RECORDS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(FEATURES, generator=g)
        if i == 1337:
            x[7] = 3.0e38  # an overflowed export: squares to inf in float32
        return x, x[:4].sum(0, keepdim=True)


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 96), nn.Tanh(), nn.Linear(96, 96), nn.Tanh(), nn.Linear(96, 1))


def run_epoch(ddp: nn.Module, loader: DataLoader, opt: torch.optim.Optimizer, rank: int) -> float:
    total, seen = 0.0, 0
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(ddp(x), y) + 1e-6 * x.pow(2).mean()
        if not math.isfinite(loss.item()):
            print(f"rank {rank} step {step}: non-finite loss, batch skipped", flush=True)
            continue
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total, seen = total + loss.item(), seen + 1
    return total / max(seen, 1)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ddp = DistributedDataParallel(build_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    sampler = DistributedSampler(FeatureRecords(), num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(FeatureRecords(), batch_size=BATCH, sampler=sampler)
    checkpoint = os.path.join(tempfile.gettempdir(), f"regressor-{os.getpid()}.pt")
    for epoch in range(int(os.environ.get("EPOCHS", "100"))):
        sampler.set_epoch(epoch)
        mean = run_epoch(ddp, loader, opt, rank)
        if rank == 0:
            torch.save(ddp.module.state_dict(), checkpoint)
            print(f"epoch {epoch} loss {mean:.4f} (rank 0), checkpoint saved", flush=True)
        dist.barrier()  # the checkpoint is on disk before any rank starts the next epoch
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
