"""A data-dependent skip inside the loop body: rank ``--odd`` sees a non-finite value once and takes the
``continue`` above the all_reduce, so it is one collective ahead and waits at the barrier of step 10
while the others wait in that step's all_reduce."""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--odd", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    for step in range(1, 30):
        x = torch.full((4,), float("nan")) if rank == args.odd and step == 5 else torch.ones(4)
        if step == 10:
            mark_ready(f"rank{rank}")
        if torch.isnan(x).any():
            continue
        dist.all_reduce(x)
        if step % 10 == 0:
            dist.barrier()


if __name__ == "__main__":
    main()
