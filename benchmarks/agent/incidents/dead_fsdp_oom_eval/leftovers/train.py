"""4-rank FSDP2 training of the LM: torchrun --nproc-per-node 4 train.py"""

import os

import torch
import torch.distributed as dist
from model import LM, lm_loss
from torch.distributed.fsdp import fully_shard

from data import batches, validation_batch

EVAL_EVERY = 25
SNAPSHOT_AT = 60


def evaluate(model, val_tokens, previews):
    """Validation loss on the held-out batch; rank 0 keeps the last tokens' logits for the report."""
    model.eval()
    logits = model(val_tokens)
    loss = lm_loss(logits, val_tokens)
    if dist.get_rank() == 0:
        previews.append(logits[:, -8:])  # the sample table written at the end of the run
    model.train()
    return loss.item()


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.cuda.memory._record_memory_history(max_entries=100000)
    model = LM(vocab=128000, dim=4096, layers=16).cuda()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    val_tokens = validation_batch(rank).cuda()
    previews = []
    for step, tokens in enumerate(batches(rank)):
        tokens = tokens.cuda(non_blocking=True)
        opt.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = lm_loss(logits, tokens)
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % EVAL_EVERY == EVAL_EVERY - 1:
            val_loss = evaluate(model, val_tokens, previews)
            if rank == 0:
                print(f"step {step} val_loss {val_loss:.4f}", flush=True)
        if step == SNAPSHOT_AT:
            torch.cuda.memory._dump_snapshot(f"snapshot-rank{rank}-step{step}.pickle")


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        torch.cuda.memory._dump_snapshot(f"snapshot-rank{dist.get_rank()}-oom.pickle")
        raise
