"""A job whose one rank stops outside any collective and leaves no traceback (for dead-job triage).

``python silent_rank.py MODE`` under torchrun (gloo). The others time out in the all_reduce
(``JOB_TIMEOUT_S``, default 10 s) and die, and the launcher ends the silent rank (``SILENT_RANK``,
default 1) without a word.

- ``queue``: each rank trains on batches its reader thread puts on a queue; the silent rank's reader
  waits for a source that never comes, so the rank blocks in ``batches.get()`` at its first step.
- ``short``: each rank iterates over its own shard; the silent rank's shard is two batches short
  and its prefetcher ends without a word, so the rank blocks in ``next_batch`` (``q.get()``).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def read_source(q: queue.Queue[torch.Tensor], source: threading.Event) -> None:
    source.wait()
    while True:
        q.put(torch.ones(4))


def train_queue(rank: int, silent: bool) -> None:
    batches: queue.Queue[torch.Tensor] = queue.Queue(maxsize=4)
    source = threading.Event()
    if not silent:
        source.set()
    threading.Thread(target=read_source, args=(batches, source), daemon=True).start()
    total = torch.zeros(4)
    for _step in range(1000):
        batch = batches.get()
        total += batch
        dist.all_reduce(total)


def prefetch(shard: list[torch.Tensor], q: queue.Queue[torch.Tensor]) -> None:
    for batch in shard:
        q.put(batch)


def next_batch(q: queue.Queue[torch.Tensor]) -> torch.Tensor:
    return q.get()


def train_short(rank: int, silent: bool) -> None:
    shard = [torch.ones(4)] * (4 if silent else 1000)
    ready: queue.Queue[torch.Tensor] = queue.Queue(maxsize=2)
    threading.Thread(target=prefetch, args=(shard, ready), daemon=True).start()
    total = torch.zeros(4)
    for _step in range(1000):
        total += next_batch(ready)
        dist.all_reduce(total)


def main() -> None:
    timeout = timedelta(seconds=float(os.environ.get("JOB_TIMEOUT_S", "10")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    mark_ready(f"rank{rank}")
    silent = rank == int(os.environ.get("SILENT_RANK", "1"))
    train = train_queue if sys.argv[1] == "queue" else train_short
    train(rank, silent)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
