"""4 ranks train; at step 40 rank 2's data read blocks on a FIFO nobody writes (outside any
collective, where no log line will show it). The job's own init_process_group(timeout=30 s)
then ends every rank: the watchdog aborts the ranks that waited, torchrun stops the rest and,
with --max-restarts=1, starts the job again, which stalls the same way."""
import datetime, os, time, torch, torch.distributed as dist

BACKEND = os.environ.get("BACKEND", "nccl")
DEV = "cuda" if BACKEND == "nccl" else "cpu"
STALL_STEP = 40


def read_batch(rank, step, shard):
    if rank == 2 and step == STALL_STEP:
        with open(os.environ["OUTDIR"] + "/stall_started", "a") as mark:
            mark.write(f"{time.time():.3f} {os.getpid()}\n")
        with open(shard, "rb") as f:  # a FIFO with no writer: open blocks in the kernel
            f.read(1)
    return torch.randn(64, 512)


def main():
    if DEV == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    shard = os.environ["OUTDIR"] + f"/shard-{rank}"
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10**6):
        x = read_batch(rank, step, shard).to(DEV)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        if step % 10 == 0:
            value = loss.item()
            if rank == 0:
                print(f"step {step} loss {value:.4f}", flush=True)


if __name__ == "__main__":
    main()
