"""torch.distributed.pipelining on gloo: stage ``--odd`` skips the last schedule step (say, an
evaluation branch) and goes on to a barrier, while the stages after it wait for its activations
inside the schedule (``_wait_batch_p2p``: a C++ wait on batch_isend_irecv work, under no c10d
frame of its own)."""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--odd", type=int, default=0)
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    stage = PipelineStage(torch.nn.Linear(8, 8), rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2)
    for step in range(a.steps):
        last = step == a.steps - 1
        if last:
            mark_ready(f"rank{rank}")
        if last and rank == a.odd:
            continue  # this stage skips the step: the next stages wait for its activations
        if rank == 0:
            schedule.step(torch.ones(4, 8))
        else:
            schedule.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
