"""A 2-rank FSDP2 model on CPU (fully_shard per block and at the root) that writes its placement report.

It also saves a torch.distributed.checkpoint of the model to ``<out>/ckpt``. Each rank also writes the bytes of its own DTensor shards (``to_local()``) to
``local-bytes-rank<R>.json`` so the test can check the budget against them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _common import mark_ready
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from rankscope.probe import dump


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(16, 64)
        self.lin2 = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(torch.relu(self.lin1(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.layers = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(16, 11, bias=False)  # 11 rows: uneven shards (6 and 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(torch.randint(0, 100, (2, 4))).sum().backward()  # a real step: the shards are in use
    dump(model, args.out, kind="placements")
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(Path(args.out, "ckpt")))
    local = sum(cast(Any, p).to_local().numel() * p.element_size() for p in model.parameters())
    Path(args.out, f"local-bytes-rank{rank}.json").write_text(json.dumps({"rank": rank, "bytes": local}))
    dist.barrier()
    mark_ready(f"rank{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
