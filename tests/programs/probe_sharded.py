"""Sharded models on 4 CPU ranks: FSDP2 on a 1-D mesh, DTensors on a 2-D (dp, tp) mesh, a DCP checkpoint.

Usage: torchrun --nproc_per_node=4 probe_sharded.py OUT
Reports go to OUT/<case>-rank<R>.json; the FSDP2 checkpoint to OUT/dcp.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _common import mark_ready
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from rankscope.probe import check_consistency, dump, placement_report, print_all_ranks


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 2 * d)
        self.fc2 = torch.nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Net(torch.nn.Module):
    def __init__(self, d: int = 16, n: int = 2) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
        self.head = torch.nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class TP(torch.nn.Module):
    """Parameters placed by hand on a (dp, tp) mesh, the way tensor parallelism lays them out."""

    def __init__(self, mesh: object) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.colwise = torch.nn.Parameter(distribute_tensor(torch.randn(8, 4), mesh, [Replicate(), Shard(0)]))
        self.rowwise = torch.nn.Parameter(distribute_tensor(torch.randn(4, 8), mesh, [Replicate(), Shard(1)]))
        self.bias = torch.nn.Parameter(distribute_tensor(torch.randn(4), mesh, [Replicate(), Replicate()]))


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def save(case: str, obj: object) -> None:
        data = obj.model_dump() if hasattr(obj, "model_dump") else obj
        (out / f"{case}-rank{rank}.json").write_text(json.dumps(data, indent=1))

    # FSDP2 on a 1-D mesh: one unit per block, then the root.
    mesh1 = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        fully_shard(block, mesh=mesh1)
    fully_shard(model, mesh=mesh1)
    model(torch.randn(2, 16)).sum().backward()
    save("fsdp_place", placement_report(model))
    save("fsdp_cons", check_consistency(model, which="all"))
    dump(model, out / "placements", kind="placements")
    # Plus a replicated plain tensor (stored whole, once) and a non-tensor entry.
    dcp.save({**model.state_dict(), "scale": torch.ones(3), "step": 7}, checkpoint_id=str(out / "dcp"))

    # FSDP2 at the root only: the whole model is one unit.
    torch.manual_seed(0)
    root_only = Net()
    fully_shard(root_only, mesh=mesh1)
    save("rootonly_place", placement_report(root_only))

    # 2-D mesh (dp=2, tp=2): Shard along tp, Replicate along dp.
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = TP(mesh2)
    save("tp_place", placement_report(tp))
    save("tp_cons", check_consistency(tp))
    with (
        torch.no_grad()
    ):  # rank 3 (dp=1, tp=1) corrupts its shard: only its replica (rank 1) is compared with it
        if rank == 3:
            tp.colwise.to_local()[0, 0] += 1.0
    # A partial sum not reduced yet (what a row-wise matmul produces before its all-reduce).
    partial = DTensor.from_local(torch.ones(4) * (rank % 2 + 1), mesh2, [Replicate(), Partial()])
    save(
        "tp_cons_bad",
        check_consistency({"colwise": tp.colwise, "rowwise": tp.rowwise, "pending": partial}, max_diff=True),
    )
    # A subgroup: each tp group (ranks 0-1, ranks 2-3) checks on its own; the values differ between groups.
    tp_group = mesh2.get_group("tp")
    save("subgroup", check_consistency(torch.full((2,), float(rank // 2)), group=tp_group))
    save("subgroup_print", print_all_ranks(f"dp {rank // 2}", group=tp_group))
    dist.barrier()
    mark_ready(f"done{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("RANKSCOPE_PROBE_TIMEOUT", "60")
    main()
