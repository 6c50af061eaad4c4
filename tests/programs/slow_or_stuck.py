"""Jobs that look stuck (torchrun, gloo, CPU): one is slow on I/O, one spins forever.

Modes (``--mode``):
  ckpt      a training loop; every ``--every`` steps rank ``--odd`` writes a checkpoint to ``--dir``
            slowly (chunks with short sleeps and an fsync each, about ``--ckpt-s`` seconds at low CPU,
            as on a slow file system) while the others wait in a barrier; then training goes on
  poll      rank ``--odd`` spins on ``while not os.path.exists(p): pass`` for a marker file that never
            appears (100% CPU) while the others wait in all_reduce
  sleeppoll the same, with a short sleep in the loop (low CPU)

Each rank marks itself ready once it has passed ``--warm`` steps (poll: once in place).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready

CHUNK = 256 * 1024


def save_checkpoint(path: str, seconds: float) -> int:
    """Write a checkpoint as a slow file system takes it: a chunk, an fsync, a short pause."""
    written = 0
    end = time.monotonic() + seconds
    with open(path, "wb") as f:
        while time.monotonic() < end:
            f.write(os.urandom(CHUNK))
            f.flush()
            os.fsync(f.fileno())
            written += CHUNK
            time.sleep(0.02)
    return written


def wait_for_marker(p: str, nap: float) -> None:
    """Poll for a file that another process was meant to create (it never does)."""
    if nap:
        while not os.path.exists(p):
            time.sleep(nap)
    else:
        while not os.path.exists(p):
            pass


def train_step(model: torch.nn.Module, x: torch.Tensor) -> None:
    loss = model(x).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def main() -> None:
    a = argparse.ArgumentParser()
    a.add_argument("--mode", required=True, choices=("ckpt", "poll", "sleeppoll"))
    a.add_argument("--odd", type=int, default=0)
    a.add_argument("--warm", type=int, default=3)
    a.add_argument("--every", type=int, default=20)
    a.add_argument("--ckpt-s", type=float, default=4.0)
    a.add_argument("--dir", default=".")
    args = a.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    model = torch.nn.Linear(16, 1)
    marker = os.path.join(args.dir, "never-created")
    for step in range(10**9):
        train_step(model, torch.rand(8, 16))
        if step == args.warm:
            mark_ready(f"rank{rank}")
        if args.mode in ("poll", "sleeppoll") and step == args.warm and rank == args.odd:
            wait_for_marker(marker, 0.05 if args.mode == "sleeppoll" else 0.0)
        if args.mode == "ckpt" and step % args.every == 0:
            if rank == args.odd:
                save_checkpoint(os.path.join(args.dir, f"ckpt{rank}.pt"), args.ckpt_s)
            dist.barrier()


if __name__ == "__main__":
    main()
