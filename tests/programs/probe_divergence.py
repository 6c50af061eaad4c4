"""Divergence cases on 3 CPU ranks; every report goes to OUT/<case>-rank<R>.json.

Usage: torchrun --nproc_per_node=3 probe_divergence.py OUT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from _common import mark_ready

from rankscope.errors import InvalidInput
from rankscope.probe import check_consistency, dump, print_all_ranks


def net(bn: bool = False) -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Linear(8, 16)]
    if bn:
        layers.append(torch.nn.BatchNorm1d(16))
    layers += [torch.nn.ReLU(), torch.nn.Linear(16, 4)]
    return torch.nn.Sequential(*layers)


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.head_a = torch.nn.Linear(8, 1)
        self.head_b = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        h = self.body(x)
        return self.head_a(h) + (self.head_b(h) if use_b else 0)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    # Before init_process_group: the probe acts locally.
    local = check_consistency(torch.ones(3))
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def save(case: str, obj: object) -> None:
        data = obj.model_dump() if hasattr(obj, "model_dump") else obj
        (out / f"{case}-rank{rank}.json").write_text(json.dumps(data, indent=1))

    save("local", local)
    save(
        "print", print_all_ranks(f"world {dist.get_world_size()}\nloss {1.25 if rank != 2 else float('nan')}")
    )

    # Missing broadcast: rank 2 seeds differently, no DDP wrap to fix it.
    torch.manual_seed(1 if rank == 2 else 0)
    model = net()
    save("nobcast", check_consistency(model, max_diff=True))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    save("bcast", check_consistency(model))

    # BatchNorm without SyncBatchNorm: same init, rank-dependent data, stats drift.
    torch.manual_seed(0)
    bn_model = net(bn=True)
    bn_model(torch.randn(32, 8) + rank)
    save("bn", check_consistency(bn_model, which="all"))

    # A NaN on one rank.
    t = torch.ones(10)
    if rank == 1:
        t[3] = float("nan")
    save("nan", check_consistency({"activations": t, "ok": torch.zeros(2)}))

    # A parameter unused on rank 1: its grad is None there.
    torch.manual_seed(0)
    heads = TwoHeads()
    heads(torch.ones(2, 8), use_b=rank != 1).sum().backward()
    save("unused", check_consistency(heads, which="grads"))

    # Keys present on some ranks only.
    sd = {"a": torch.ones(2), **({"extra": torch.ones(1)} if rank == 0 else {})}
    save("keys", check_consistency(sd))

    # Non-tensor input is an error with a fix, not a traceback.
    try:
        check_consistency(42)
    except InvalidInput as exc:
        save("badinput", {"error": exc.render()})

    # Offline material: fingerprint files and torch.save'd state_dicts (rank 2 still diverges).
    torch.manual_seed(1 if rank == 2 else 0)
    offline = net()
    dump(offline, out / "fp")
    (out / "sd").mkdir(exist_ok=True)
    torch.save(offline.state_dict(), out / "sd" / f"model_rank{rank}.pt")
    # A rank that skips the probe: the others fail after the probe timeout instead of hanging.
    os.environ["RANKSCOPE_PROBE_TIMEOUT"] = "3"
    from rankscope.probe import _dist

    _dist.probe_group()  # every rank creates the short-timeout group together
    if rank != 2:
        try:
            check_consistency(model)
        except _dist.ProbeTimeout as exc:
            save("timeout", {"error": exc.render()})
    dist.barrier()
    mark_ready(f"done{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("RANKSCOPE_PROBE_TIMEOUT", "60")
    main()
