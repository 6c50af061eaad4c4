"""A data-parallel training job of realistic shape on CPU (gloo): DDP, a DataLoader with workers,
a model of nested modules, a metrics thread, eight ranks started by torchrun.

Benchmark incident ``live_gloo_ddp8``: the agent is told only that the job stopped printing.
"""

from __future__ import annotations

import datetime
import os
import queue
import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, Sampler

SAMPLES = 4096
BATCH = 16


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(32, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class Records(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randn(1, generator=g)


class ShardSampler(Sampler[int]):
    """Each rank's contiguous shard of the records; the last shard takes the remainder."""

    def __init__(self, n: int, rank: int, world: int, skip: set[int]) -> None:
        per = n // world
        start = rank * per
        stop = n if rank == world - 1 else start + per
        self.indices = [i for i in range(start, stop) if i not in skip]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def corrupt_records() -> set[int]:
    """Records the data team flagged as unreadable: they are left out of the epoch."""
    return set(range(2570, 2570 + BATCH))


def metrics_writer(q: queue.Queue[tuple[int, float] | None]) -> None:
    while q.get() is not None:  # a real job would write each (step, loss) somewhere
        pass


def evaluate(model: nn.Module, rank: int) -> float:
    dist.barrier()  # every rank has finished the epoch
    model.eval()
    with torch.no_grad():
        score = torch.tensor([float(model(torch.randn(8, 32, device="cuda")).mean())], device="cuda")
    dist.all_reduce(score)
    model.train()
    return float(score) / dist.get_world_size()


def train_epoch(
    ddp: nn.Module,
    loader: DataLoader,
    opt: torch.optim.Optimizer,
    epoch: int,
    rank: int,
    q: queue.Queue[tuple[int, float] | None],
) -> None:
    for step, (x, y) in enumerate(loader):
        x, y = x.cuda(), y.cuda()
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        q.put((step, float(loss.detach())))
        if step % 40 == 0:
            print(f"rank {rank} epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)


def main() -> None:
    torch.cuda.set_device(0)  # every rank on the one GPU (rank.sh gives each its own NCCL host id)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=int(os.environ.get("PG_TIMEOUT", "60"))))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Model().cuda()
    ddp = DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    sampler = ShardSampler(SAMPLES, rank, world, corrupt_records())
    loader = DataLoader(Records(), batch_size=BATCH, sampler=sampler, num_workers=2, persistent_workers=True)
    q: queue.Queue[tuple[int, float] | None] = queue.Queue()
    threading.Thread(target=metrics_writer, args=(q,), name="metrics-writer", daemon=True).start()
    for epoch in range(int(os.environ.get("EPOCHS", "1000"))):
        train_epoch(ddp, loader, opt, epoch, rank, q)
        score = evaluate(model, rank)
        if rank == 0:
            print(f"epoch {epoch} eval {score:.4f}", flush=True)
    q.put(None)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
