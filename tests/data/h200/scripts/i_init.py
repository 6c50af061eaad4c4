"""Static rendezvous (env://) with WORLD_SIZE=4 where rank 3 never starts: the others wait
before their first collective. MODE=lazy: init_process_group then the first all_reduce;
MODE=eager: init_process_group(device_id=...) creates the communicator at once."""
import datetime, os, torch, torch.distributed as dist

BACKEND = os.environ.get("BACKEND", "nccl")
DEV = "cuda" if BACKEND == "nccl" else "cpu"


def main():
    if DEV == "cuda":
        torch.cuda.set_device(0)
    kw = {"device_id": torch.device("cuda:0")} if os.environ.get("MODE") == "eager" and DEV == "cuda" else {}
    dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=300), **kw)
    print(f"rank {dist.get_rank()} initialised", flush=True)
    t = torch.ones(4, device=DEV)
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} first all_reduce {t.sum().item()}", flush=True)


if __name__ == "__main__":
    main()
