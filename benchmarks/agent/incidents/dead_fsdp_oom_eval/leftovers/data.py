"""Token batches from the pre-tokenized shards, one shard list per rank."""

import glob
import os

import numpy as np
import torch

DATA = os.environ.get("DATA_DIR", "/data/tokens")
SEQ = 4096
BATCH = 2


def _shards(rank: int, split: str) -> list[str]:
    files = sorted(glob.glob(f"{DATA}/{split}/shard-*.npy"))
    return files[rank::4]


def batches(rank: int):
    """Training batches of (BATCH, SEQ) tokens, forever."""
    while True:
        for path in _shards(rank, "train"):
            tokens = np.load(path, mmap_mode="r")
            for start in range(0, len(tokens) - BATCH * SEQ, BATCH * SEQ):
                chunk = np.asarray(tokens[start : start + BATCH * SEQ], dtype=np.int64)
                yield torch.from_numpy(chunk).view(BATCH, SEQ)


def validation_batch(rank: int, seq: int = 1024) -> torch.Tensor:
    """One fixed held-out batch of (BATCH, seq) tokens."""
    tokens = np.load(_shards(rank, "val")[0], mmap_mode="r")
    return torch.from_numpy(np.asarray(tokens[: BATCH * seq], dtype=np.int64)).view(BATCH, seq)
