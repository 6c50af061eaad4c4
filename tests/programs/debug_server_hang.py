"""A gloo job running PyTorch's debug server, hung: rank 1 never joins the second all_reduce.

``python debug_server_hang.py FRONTEND_PORT`` under torchrun. Each rank's worker
server registers ``debug_server/rank<R>`` in the job's TCPStore.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "200")

import torch
import torch.distributed as dist
from _common import mark_ready
from torch.distributed.debug import start_debug_server


def wait_for_data() -> None:
    threading.Event().wait()


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        start_debug_server(port=int(sys.argv[1]), dump_interval=3600.0)
    except ModuleNotFoundError:
        # Rank 0's HTML frontend needs tabulate/jinja2/aiohttp; the per-rank worker server
        # (what rankscope talks to) is already up and registered in the store by then.
        pass
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    mark_ready(f"rank{rank}")
    if rank == 1:
        wait_for_data()
    dist.all_reduce(t)
    threading.Event().wait()


if __name__ == "__main__":
    main()
