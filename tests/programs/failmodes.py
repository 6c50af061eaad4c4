"""Real failures under torchrun on CPU/gloo, for log triage tests.

``python failmodes.py MODE`` where MODE is one of: timeout, exit_early,
unused_params, dl_worker_kill, sigkill, odd_shape, odd_op, ok. Rank 1 is the culprit in each
(odd_shape: rank ``$ODD_RANK``, default 2, under TORCH_DISTRIBUTED_DEBUG=DETAIL).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def _init(timeout_s: float = 60.0) -> tuple[int, int]:
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def timeout() -> None:
    rank, _ = _init(timeout_s=5.0)
    t = torch.ones(4)
    dist.all_reduce(t)  # seq 1 on both ranks
    if rank == 1:
        # The culprit: never joins the second all_reduce; stays alive past the peers' timeout.
        mark_ready("culprit")
        time.sleep(12)
        os._exit(0)
    dist.all_reduce(t)


def exit_early() -> None:
    rank, _ = _init()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        # Leaves cleanly (exit code 0) while rank 0 still expects it: only rank 0 "fails".
        print("rank 1: no more data, leaving the training loop", flush=True)
        os._exit(0)
    dist.all_reduce(t)


def unused_params() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = torch.nn.Linear(4, 4)
            self.unused = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    _init()
    model = DDP(Net())
    for _ in range(2):
        model(torch.ones(2, 4)).sum().backward()


class _KillingDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if int(os.environ["RANK"]) == 1 and i == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.ones(2)


def dl_worker_kill() -> None:
    _init()
    loader = torch.utils.data.DataLoader(_KillingDataset(), batch_size=1, num_workers=1)
    for batch in loader:
        dist.all_reduce(batch)


def sigkill() -> None:
    rank, _ = _init()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)


def odd_shape() -> None:
    """One rank all-reduces a tensor of another shape: under DETAIL every other rank names it."""
    rank, _ = _init()
    odd = int(os.environ.get("ODD_RANK", "2"))
    dist.all_reduce(torch.ones(8 if rank == odd else 4))


def odd_op() -> None:
    """Five all_reduces agree; at the sixth collective (sequence number 5) rank ``$ODD_RANK`` calls a
    barrier while the others all-reduce: under DETAIL each side reports the other's checker."""
    rank, _ = _init()
    odd = int(os.environ.get("ODD_RANK", "2"))
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
    if rank == odd:
        dist.barrier()
    else:
        dist.all_reduce(torch.ones(4))


def ok() -> None:
    _init()
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


if __name__ == "__main__":
    mode = sys.argv[1]
    globals()[mode]()
    if dist.is_initialized():
        dist.destroy_process_group()
