"""Jobs a watch is started beside (torchrun, gloo, CPU): they train, then one rank stalls.

Modes (``--mode``):
  data    after ``--warm`` steps rank ``--odd`` blocks in a data read (opening a FIFO nobody writes:
          no collective, nothing in any log), while the others wait in all_reduce until the job's own
          ``--dist-timeout`` ends them
  locks   after ``--warm`` steps two threads of rank ``--odd`` take two locks in opposite order,
          under a timing forced by events (each holds one and waits for the other); the main thread
          joins them, and the others wait in all_reduce until the timeout
  ckpt    after ``--warm`` steps rank ``--odd`` writes a checkpoint slowly for ``--pause`` seconds
          (a few bytes, then a sleep: a stalled file system), the others wait in a barrier; then
          training goes on for ``--after`` more steps and the job ends
With ``--go FILE`` the stall waits, training on, until FILE exists (the test starts its watch first).
Every step prints a line (the job's progress). Each rank marks ``warm-rank<R>`` ready after the warm
steps (attempt N > 0 of a restarted job: ``warm-a<N>-rank<R>``); rank ``--odd`` marks ``stalling``
(``stalling-a<N>``) just before it stalls.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


def read_shard(path: str) -> bytes:
    """The data read that never returns: a FIFO with no writer blocks in open()."""
    if not os.path.exists(path):
        os.mkfifo(path)
    with open(path, "rb") as f:
        return f.read()


def lock_cycle() -> None:
    """Two threads, two locks, opposite order; the events force the deadly interleaving."""
    a, b = threading.Lock(), threading.Lock()
    a_held, b_held = threading.Event(), threading.Event()

    def saver() -> None:
        with a:
            a_held.set()
            b_held.wait()
            with b:
                pass

    def logger() -> None:
        with b:
            b_held.set()
            a_held.wait()
            with a:
                pass

    threads = [threading.Thread(target=saver, name="saver"), threading.Thread(target=logger, name="logger")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def slow_checkpoint(path: str, seconds: float) -> None:
    """A checkpoint write on a file system that stalls: a few bytes now and then, mostly waiting."""
    end = time.monotonic() + seconds
    with open(path, "wb") as f:
        while time.monotonic() < end:
            f.write(b"x" * 64)
            f.flush()
            time.sleep(0.5)


def go_seen(path: str) -> bool:
    """Whether rank 0 sees the go file: every rank agrees on the step the stall comes at."""
    flag = torch.tensor([float(dist.get_rank() == 0 and os.path.exists(path))])
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("data", "locks", "ckpt"), required=True)
    ap.add_argument("--odd", type=int, default=2)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--dist-timeout", type=float, default=30.0)
    ap.add_argument("--pause", type=float, default=15.0)
    ap.add_argument("--after", type=int, default=10)
    ap.add_argument("--step-s", type=float, default=0.2)
    ap.add_argument("--go", default=None, help="stall only once this file exists (after the warm steps)")
    ap.add_argument(
        "--store", choices=("file", "env"), default="file", help="env: torchrun's store (many nodes)"
    )
    args = ap.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    tag = f"-a{attempt}" if attempt else ""
    scratch = os.path.dirname(os.environ.get("RANKSCOPE_TEST_READY", "/tmp/x"))
    store = os.path.join(scratch, f"store-{os.getppid()}-{attempt}")  # each attempt meets anew
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}" if args.store == "file" else "env://",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=args.dist_timeout),
    )
    rank = dist.get_rank()
    mark_ready(f"up{tag}-rank{rank}")
    t = torch.ones(4)
    step, stall_at = 0, args.warm + 1
    while True:
        step += 1
        if args.go and step == stall_at and not go_seen(args.go):
            stall_at += 1  # the test says when: keep training until it does
        if step == stall_at and rank == args.odd:
            mark_ready(f"stalling{tag}")
            if args.mode == "data":
                read_shard(os.path.join(scratch, f"shard-{os.getppid()}-{attempt}"))
            elif args.mode == "locks":
                lock_cycle()
            else:
                slow_checkpoint(os.path.join(scratch, f"ckpt-{rank}.pt"), args.pause)
        if args.mode == "ckpt" and step == stall_at:
            dist.barrier()
        dist.all_reduce(t)
        print(f"rank {rank} step {step}", flush=True)
        if step == args.warm:
            mark_ready(f"warm{tag}-rank{rank}")
        if args.mode == "ckpt" and step >= stall_at + args.after:
            break
        time.sleep(args.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
