"""NCCL jobs for the progress window, 4 ranks on one GPU (see rank.sh). --mode:
  healthy   a DDP-style loop, nothing wrong
  straggler rank 2's shard is 1024 px (the others 64): CPU work in load_batch holds the others back
  busy      rank 0 runs a long CPU evaluation at step 20 while the others wait in barrier()
  gpueval   rank 0 runs a long GPU evaluation loop (.item() per batch) at step 20; the others wait in barrier()
  lone      rank 0 calls all_gather_object in an evaluation branch at step 20 that the others skip
  skipstep  rank 1 skips step 20 (an empty batch: continue); every rank then reaches the final barrier()
Each rank touches $READY/rank<r> where the interesting part starts."""
import argparse, datetime, os, time, torch, torch.distributed as dist
import torch.nn.functional as F

def ready(rank):
    open(os.path.join(os.environ["READY"], f"rank{rank}"), "w").close()

def load_batch(side, g):
    images = torch.rand(32, 1, side, side, generator=g)
    return F.adaptive_avg_pool2d(images, 16).flatten(1).cuda()

def evaluate_cpu(seconds):
    total, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        for i in range(20000):
            total += (i % 7) * 0.5
    return total

def evaluate_gpu(model, batches):
    score = 0.0
    for batch in range(batches):
        x = torch.randn(4096, 256, device="cuda")
        for _ in range(50):
            x = torch.tanh(x @ torch.randn(256, 256, device="cuda"))[:, :256]
        score += x.mean().item()
    return score

def main():
    p = argparse.ArgumentParser(); p.add_argument("--mode", required=True); a = p.parse_args()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=900))
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    side = 1024 if a.mode == "straggler" and rank == 2 else 64
    for step in range(10**7):
        if step == 20:
            if a.mode in ("healthy", "straggler"):
                ready(rank)
            elif a.mode == "busy":
                ready(rank)
                if rank == 0:
                    evaluate_cpu(3600)
                dist.barrier()
            elif a.mode == "gpueval":
                ready(rank)
                if rank == 0:
                    evaluate_gpu(model, 10**6)
                dist.barrier()
            elif a.mode == "lone" and rank == 0:
                ready(rank)
                gathered = [None] * dist.get_world_size()
                dist.all_gather_object(gathered, {"acc": 0.5})
            elif a.mode == "lone" and step == 20:
                ready(rank)
            elif a.mode == "skipstep" and rank == 1:
                continue
        if a.mode == "skipstep" and step == 40:
            ready(rank)
            dist.barrier()
            torch.cuda.synchronize()
            time.sleep(3600)
        x = load_batch(side, g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for q in model.parameters():
            dist.all_reduce(q.grad)
        opt.step()
        if step % 10 == 0:
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)

if __name__ == "__main__":
    main()
