"""A gloo job whose ranks serve torchelastic's worker handlers on their own unix sockets, hung:
rank 1 never joins the second all_reduce.

``python worker_socket_hang.py SOCKET_DIR`` under torchrun. Each rank re-executes itself with
``TORCH_WORKER_SERVER_SOCKET=SOCKET_DIR/worker<LOCAL_RANK>.sock`` so that the variable is in its
/proc environment, as a launcher that sets it per rank would leave it, then runs its main inside
``torch.distributed.elastic.control_plane.worker_main``.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta

WORKER_SOCKET = "TORCH_WORKER_SERVER_SOCKET"

if WORKER_SOCKET not in os.environ:
    path = os.path.join(sys.argv[1], f"worker{os.environ['LOCAL_RANK']}.sock")
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, WORKER_SOCKET: path})

import torch  # noqa: E402 - after the re-exec above, which must come first
import torch.distributed as dist  # noqa: E402
from _common import mark_ready  # noqa: E402
from torch.distributed.elastic.control_plane import worker_main  # noqa: E402


def main() -> None:
    with worker_main():
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        rank = dist.get_rank()
        t = torch.ones(4)
        dist.all_reduce(t)
        mark_ready(f"rank{rank}")
        if rank == 1:
            threading.Event().wait()  # "waiting for data": never joins the second all_reduce
        dist.all_reduce(t)


if __name__ == "__main__":
    main()
