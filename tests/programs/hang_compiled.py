"""torch.compile on gloo: a compiled step issues a functional all_reduce, and rank ``--odd``
skips the last step for a barrier. The other ranks wait in the compiled graph's
``torch.ops._c10d_functional.wait_tensor`` - a C++ call from inductor's generated code, so the
innermost Python frames are the generated ``Runner.call`` and torch/_ops.py."""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from _common import mark_ready


@torch.compile
def step(x: torch.Tensor) -> torch.Tensor:
    return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--odd", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    for i in range(a.steps):
        last = i == a.steps - 1
        if last:
            mark_ready(f"rank{rank}")
        if last and rank == a.odd:
            continue
        step(torch.ones(4))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
