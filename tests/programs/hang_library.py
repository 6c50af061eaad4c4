"""A training script whose loop lives in an installed library (trainlib, in site-packages).

Rank ``--odd`` gets a batch with a non-finite loss; the library skips it on that rank only, so
that rank runs out of gradient all-reduces first and waits in the checkpoint callback's barrier
while the others wait in the all-reduce of their next batch.
"""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready
from trainlib import Checkpoint, Trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--odd", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    batches = [torch.ones(4) for _ in range(4)]
    if rank == args.odd:
        batches[1] = torch.full((4,), float("nan"))
    mark_ready(f"rank{rank}")
    trainer = Trainer(callbacks=[Checkpoint()])
    trainer.fit(batches, loss_fn=lambda b: b.sum())


if __name__ == "__main__":
    main()
