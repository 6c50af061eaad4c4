"""A library call that is itself a collective, made on rank 0 only, under a rank guard.

``--mode`` picks the library: ``zero`` (ZeroRedundancyOptimizer.consolidate_state_dict, under DDP),
``fsdp2`` (get_model_state_dict with a full state dict of an FSDP2 model), ``dcp``
(torch.distributed.checkpoint.save) or ``metrics`` (trainlib's Accuracy.compute, an
all_gather_object inside an installed package). Rank 0 checkpoints at step 2 alone; the others go
on to the next step's all_reduce and wait there (``--no-tail``: in the next step's backward, DDP's
gradient all-reduce, as a training loop without a collective of its own does).
"""

from __future__ import annotations

import argparse
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def _build(mode: str) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
    model: torch.nn.Module = torch.nn.Linear(4, 4)
    optim: torch.optim.Optimizer | None = None
    if mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        optim = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    elif mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
    return model, optim


def save_checkpoint(mode: str, model: torch.nn.Module, optim: torch.optim.Optimizer | None) -> None:
    """What rank 0 runs alone: each mode's library call."""
    if mode == "zero":
        assert optim is not None
        optim.consolidate_state_dict(to=0)
    elif mode == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    elif mode == "dcp":
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": model.state_dict()}, checkpoint_id=tempfile.mkdtemp())
    else:
        from trainlib.metrics import Accuracy

        metric = Accuracy()
        metric.update(3, 4)
        metric.compute()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["zero", "fsdp2", "dcp", "metrics"], required=True)
    parser.add_argument(
        "--no-tail",
        action="store_true",
        help="no all_reduce after the step: the others wait in the next backward",
    )
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    model, optim = _build(args.mode)
    for step in range(4):
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        if optim is not None:
            optim.step()
        if step == 2:
            mark_ready(f"rank{rank}")
        if rank == 0 and step == 2:
            save_checkpoint(args.mode, model, optim)
        if not args.no_tail:
            dist.all_reduce(torch.ones(1))


if __name__ == "__main__":
    main()
