"""A 2-rank gloo job that hangs in a known way, for the MCP server tests.

``--mode divergent``: rank 1 blocks in its own code (an Event nobody sets) while
rank 0 waits in all_reduce -> verdict divergent_ranks, suspect rank 1.
``--mode mismatch``: rank 1 calls barrier() while rank 0 calls all_reduce ->
verdict mismatched_collectives.

Each rank creates its readiness file just before it blocks. The process group
timeout is long so that gloo never aborts the hang while a test inspects it.
"""

from __future__ import annotations

import argparse
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def wait_for_config_reload(event: threading.Event) -> None:
    """Stands in for rank-specific work that never finishes (a queue, a lock, a file)."""
    event.wait()


def train_step(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("divergent", "mismatch"), default="divergent")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    x = torch.ones(8)
    dist.all_reduce(x)  # every rank is up and connected
    if rank == 1:
        if args.mode == "divergent":
            mark_ready(f"rank{rank}")
            wait_for_config_reload(threading.Event())
        else:
            mark_ready(f"rank{rank}")
            dist.barrier()
    mark_ready(f"rank{rank}")
    train_step(x)


if __name__ == "__main__":
    main()
