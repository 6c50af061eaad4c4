"""A rank whose DataLoader worker blocks reading its shard: the shard of rank ``--odd`` is a named pipe
with no writer, so its worker's ``open()`` never returns; the others go on to the all_reduce.

``--shards DIR`` holds one file per rank (``shard<N>``): the test makes rank ``--odd``'s a FIFO.
``--feeder thread``: a thread of the rank reads the shard into a queue the main thread waits on,
instead of a DataLoader worker.
"""

from __future__ import annotations

import argparse
import os
import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready
from torch.utils.data import DataLoader, Dataset


class ShardDataset(Dataset[torch.Tensor]):
    """Reads this rank's shard, one record per item."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.path, "rb") as shard:
            data = shard.read(4)
        return torch.tensor(list(data[:1] or b"\0"), dtype=torch.float32)


def read_shards(dataset: ShardDataset, out: queue.Queue[torch.Tensor]) -> None:
    """The feeder thread: every record of the shard into the queue."""
    for i in range(len(dataset)):
        out.put(dataset[i])


def from_thread(dataset: ShardDataset) -> list[torch.Tensor]:
    """The batches, read by a thread of this rank through a queue."""
    batches: queue.Queue[torch.Tensor] = queue.Queue()
    threading.Thread(target=read_shards, args=(dataset, batches), name="reader", daemon=True).start()
    return [batches.get() for _ in range(len(dataset))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--odd", type=int, default=2)
    parser.add_argument("--feeder", choices=["loader", "thread"], default="loader")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    dataset = ShardDataset(os.path.join(args.shards, f"shard{rank}"))
    if args.feeder == "thread":
        for batch in from_thread(dataset):
            mark_ready(f"rank{rank}")
            dist.all_reduce(batch)
        return
    loader = DataLoader(dataset, num_workers=1)
    for batch in loader:
        mark_ready(f"rank{rank}")
        dist.all_reduce(batch)


if __name__ == "__main__":
    main()
