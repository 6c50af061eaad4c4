"""A torchrun job restarted once (``--max-restarts=1``): rank 1 of the first attempt dies with
exit code 3 after the first all_reduce; in the second attempt rank 1 waits for "data" before
``init_process_group``, so rank 0 waits for it in the rendezvous.

Each attempt meets in a file store of its own next to the readiness folder, so that nothing of
the first attempt is left where the second meets. Each rank marks ``attempt<N>-rank<R>`` ready
(attempt 1 just before it blocks).
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def main() -> None:
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    if attempt >= 1:
        mark_ready(f"attempt{attempt}-rank{rank}")
        if rank == 1:
            threading.Event().wait()  # "waiting for data": never reaches init_process_group
    store = os.path.join(
        os.path.dirname(os.environ["RANKSCOPE_TEST_READY"]), f"store-{os.getppid()}-{attempt}"
    )
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=300)
    )
    t = torch.ones(2)
    dist.all_reduce(t)
    mark_ready(f"attempt{attempt}-rank{rank}")
    if rank == 1:
        os._exit(3)
    dist.all_reduce(t)


if __name__ == "__main__":
    main()
