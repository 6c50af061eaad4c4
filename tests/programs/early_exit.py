"""Rank 1 runs out of batches and returns (exit code 0) while rank 0 waits for it: torchrun keeps
the job up, since a rank that succeeds is not a failure. Rank 1 says why on stderr.

Rank 0 waits on the job's TCPStore for a key rank 1 would have set, not in a gloo collective:
gloo notices a peer's closed connection and fails the collective at once, which would end the
job before it can be looked at.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    t = torch.ones(2)
    dist.all_reduce(t)
    mark_ready(f"rank{rank}")
    if rank == 1:
        print(
            "rank 1: StopIteration: the shard has no batch 2, leaving the loop", file=sys.stderr, flush=True
        )
        # a clean exit (code 0): without it the gloo group's teardown can abort the rank (SIGABRT)
        # and torchrun would then end the whole job
        dist.destroy_process_group()
        return
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=300),
    )
    mark_ready("rank0-waits")  # connected: from here on rank 0 only waits
    store.wait(["rank1/epoch_done"])


if __name__ == "__main__":
    main()
