"""Per-rank checkpoints of a real DDP job on CPU (gloo), the way a job saves what each rank resumes from.

Every rank saves ``{"model", "optim", "rng", "step"}`` to ``OUT/<save>/rank<R>.pt``:
- ``step20``, ``step30``: two saves of one run (Adam, DDP: weights and optimizer state identical
  on every rank; the RNG state is each rank's own);
- ``resumed``: the run resumed at step 30 with the last rank loading its ``step20`` file (a save
  that never reached it), then 10 more steps and a save: its optimizer is 10 steps behind the
  others', and its weights drifted although DDP broadcast rank 0's at the resume;
- ``ema``: the step-30 state, with an EMA copy of the weights kept by rank 2 only (a
  rank-dependent option);
- ``other_run``: a run of the same model from another seed, saved at step 5 (its config says so).

Usage: torchrun --nproc_per_node=4 save_rank_state.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _common import mark_ready
from torch.nn.parallel import DistributedDataParallel


def build(
    seed: int, ckpt: dict[str, Any] | None = None
) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    """The model and its optimizer, from ``ckpt`` when given; DDP broadcasts rank 0's weights."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
    return DistributedDataParallel(model), opt


def train(ddp: DistributedDataParallel, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(16, 8)  # each rank its own batch: the RNG is seeded per rank
        loss = (ddp(x) - x[:, :1]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def save(
    out: Path,
    name: str,
    ddp: DistributedDataParallel,
    opt: torch.optim.Optimizer,
    step: int,
    seed: int = 0,
    **extra: Any,
) -> None:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        "model": ddp.module.state_dict(),
        "optim": opt.state_dict(),
        "rng": torch.get_rng_state(),
        "step": step,
        "config": {"seed": seed, "lr": 1e-2},
    }
    torch.save({**state, **extra}, folder / f"rank{dist.get_rank()}.pt")


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    ddp, opt = build(0)
    torch.manual_seed(100 + rank)
    train(ddp, opt, 20)
    save(out, "step20", ddp, opt, 20)
    train(ddp, opt, 10)
    save(out, "step30", ddp, opt, 30)
    ema = {k: v.clone() for k, v in ddp.module.state_dict().items()}
    save(out, "ema", ddp, opt, 30, **({"ema": ema} if rank == 2 else {}))
    dist.barrier()  # every save is on disk before any rank resumes from one
    ckpt = torch.load(
        out / ("step20" if rank == world - 1 else "step30") / f"rank{rank}.pt", weights_only=True
    )
    resumed, resumed_opt = build(0, ckpt)
    train(resumed, resumed_opt, 10)
    save(out, "resumed", resumed, resumed_opt, ckpt["step"] + 10)
    other, other_opt = build(1234)
    train(other, other_opt, 5)
    save(out, "other_run", other, other_opt, 5, seed=1234)
    dist.barrier()
    mark_ready(f"done{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
