"""Gradual unfreezing with a gradient averager that captured its parameter list too early.

The backbone is frozen for the first two epochs (3 steps each); the averager lists the parameters
that require grad when it is built, so after the unfreeze at step 6 the backbone's gradients are
never averaged and its weights drift apart across ranks. Each rank writes OUT/<case>-rank<R>.json.

Usage: torchrun --nproc_per_node=2 probe_unfreeze.py OUT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from _common import mark_ready

from rankscope.probe import check_consistency, watch_consistency

UNFREEZE_STEP = 6
STEPS = 14


class GradAverager:
    """Averages the gradients of the parameters that required grad when it was built."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]

    def sync(self) -> None:
        world = dist.get_world_size()
        for p in self.params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def save(case: str, data: object) -> None:
        (out / f"{case}-rank{rank}.json").write_text(json.dumps(data, indent=1))

    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module(
        "backbone", torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    )
    model.add_module("head", torch.nn.Linear(16, 4))
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    averager = GradAverager(model)  # the bug: built before the backbone is unfrozen
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = watch_consistency(model, every=2)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for step in range(STEPS):
        if step == UNFREEZE_STEP:
            for p in model.backbone.parameters():
                p.requires_grad_(True)
        x = torch.randn(16, 8, generator=data)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        averager.sync()
        if step == UNFREEZE_STEP + 2:
            report = check_consistency(model, which="grads")
            save("grads", {"report": report.model_dump(), "text": str(report)})
        opt.step()
        watch.step(step)
    save(
        "watch",
        {
            "first_divergent_step": watch.first_divergent_step,
            "last_consistent_step": watch.last_consistent_step,
            "checks": watch.checks,
            "divergent": [d.name for d in watch.report.divergent] if watch.report else [],
            "text": str(watch),
        },
    )
    dist.barrier()
    mark_ready(f"done{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("RANKSCOPE_PROBE_TIMEOUT", "60")
    main()
