"""Pairs [0,1] and [2,3] all-reduce in their own groups; rank 3 skips one of its pair's all_reduces
and goes on to the global barrier, leaving rank 2 waiting in the pair's all_reduce.

``--groups table`` keeps both groups in a list (``pairs``), as most jobs do: each rank's list
holds its own group and c10d's NON_GROUP_MEMBER (-100) for the other. ``--groups helper``
builds them in a function that returns only the rank's own group, so no local says who the
members are. ``--probe DIR`` turns on rankscope.probe's flight recorder, which rankscope asks
for a dump while it reads the stacks; ``--debug-server PORT`` starts torch's debug server."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from _common import mark_ready


def _my_pair(rank: int) -> dist.ProcessGroup:
    mine = None
    for members in ([0, 1], [2, 3]):
        group = dist.new_group(members)
        if rank in members:
            mine = group
    assert mine is not None
    return mine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", choices=["table", "helper"], default="table")
    parser.add_argument("--probe", default=None)
    parser.add_argument(
        "--debug-server", type=int, default=None, help="start torch's debug server (frontend port)"
    )
    options = parser.parse_args()
    how = options.groups
    if options.probe:
        from rankscope.probe import enable_flight_recorder

        enable_flight_recorder(options.probe)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if options.debug_server is not None:
        from torch.distributed.debug import start_debug_server

        try:
            start_debug_server(port=options.debug_server, dump_interval=3600.0)
        except ModuleNotFoundError:
            pass  # rank 0's HTML frontend needs aiohttp/jinja2; the worker servers are up by then
    if how == "table":
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mine = pairs[rank // 2]
    else:
        mine = _my_pair(rank)
    for step in range(3):
        t = torch.ones(2)
        if rank == 3 and step == 1:
            continue  # the skipped collective
        if step == 2 and rank == 2:
            mark_ready(f"rank{rank}")
        dist.all_reduce(t, group=mine)
    mark_ready(f"rank{rank}")
    dist.barrier()


if __name__ == "__main__":
    main()
