"""4-rank FSDP2 training of the LM: torchrun --nproc-per-node 4 train.py"""

import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from data import batches
from model import LM, lm_loss












































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
    last_token_logits = []  # rank 3 plots these








    for step, tokens in enumerate(batches(rank)):
        tokens = tokens.cuda(non_blocking=True)
        opt.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = lm_loss(logits, tokens)
        loss.backward()
        opt.step()
        if rank == 3 and step % 10 == 0:
            last_token_logits.append(logits[:, -1])  # a view: keeps the whole logits alive
        if step == 50:
            torch.cuda.memory._dump_snapshot(f"snapshot-rank{rank}-step50.pickle")












if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        torch.cuda.memory._dump_snapshot(f"snapshot-rank{dist.get_rank()}-oom.pickle")
        raise
