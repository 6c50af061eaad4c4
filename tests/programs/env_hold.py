"""A rank that joins the group, optionally starts DataLoader workers, signals readiness and waits.

Used by tests/integration/test_env.py to read a live job's environment. ``--workers N`` keeps
N DataLoader worker processes alive (children of the rank) while it waits.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from _common import mark_ready


class _Slow(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.5)
        return torch.zeros(1)


def main() -> None:
    workers = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    it = None
    if workers:
        loader = torch.utils.data.DataLoader(_Slow(), batch_size=1, num_workers=workers, prefetch_factor=1)
        it = iter(loader)
        next(it)
    mark_ready(f"rank{rank}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and os.getppid() != 1:
        time.sleep(0.2)
    del it


if __name__ == "__main__":
    main()
