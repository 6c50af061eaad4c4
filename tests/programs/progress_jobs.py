"""Jobs that look stuck and are not (torchrun, gloo, CPU), for the progress window.

Modes (``--mode``):
  healthy    a DDP-style loop: forward, backward, all_reduce of the gradients, optimizer step;
             it logs every 50 steps and nothing is wrong with it
  straggler  the same loop, but rank ``--odd``'s shard holds larger images (``side`` 16x the
             others'), so each of its steps costs many times the others' compute: the job moves,
             held back by that rank, whose time goes to ``load_batch``
  busy       rank ``--odd`` runs a long evaluation in its own code (CPU-bound, minutes) while the
             others wait for it in a barrier: nothing completes, yet nobody is stuck
  spin       every rank computes in one long call of its own (no collective, no counter moving)

Each rank marks itself ready once it has passed ``--warm`` steps (busy: once it is in place).
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def load_batch(side: int) -> torch.Tensor:
    """Decode a batch of images: the cost grows with the square of the side."""
    images = torch.rand(4, 3, side, side)
    return torch.nn.functional.avg_pool2d(images, kernel_size=images.shape[-1] // 8).flatten(1)[:, :16]


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None
        dist.all_reduce(p.grad)
    opt.step()
    return float(loss)


def evaluate(seconds: float) -> float:
    """A long evaluation that only one rank runs: pure CPU in the job's own code."""
    total = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i in range(20000):
            total += (i % 7) * 0.5
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=("healthy", "straggler", "busy", "spin"))
    p.add_argument("--odd", type=int, default=2)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--side", type=int, default=64)
    p.add_argument("--factor", type=int, default=16, help="straggler: its images are this many times wider")
    p.add_argument(
        "--probe", default=None, help="turn on rankscope.probe's flight recorder, dumps to this folder"
    )
    a = p.parse_args()
    if a.probe:
        from rankscope.probe import enable_flight_recorder

        enable_flight_recorder(a.probe)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    side = a.side * a.factor if a.mode == "straggler" and rank == a.odd else a.side
    if a.mode == "spin":
        mark_ready(f"rank{rank}")
        evaluate(3600)
        return
    for step in range(10**9):
        if a.mode == "busy" and step == a.warm:
            mark_ready(f"rank{rank}")
            if rank == a.odd:
                evaluate(3600)
            dist.barrier()
        x = load_batch(side)
        loss = train_step(model, opt, x)
        if step % 50 == 0:
            print(f"rank {rank} step {step} loss {loss:.4f}", flush=True)
        if step == a.warm and a.mode != "busy":
            mark_ready(f"rank{rank}")


if __name__ == "__main__":
    main()
