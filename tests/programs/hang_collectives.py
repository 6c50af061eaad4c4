"""A small training loop that hangs in a chosen way (torchrun, gloo, CPU).

Modes (``--mode``):
  mismatch   rank ``--odd`` calls barrier() inside a helper while the others all_reduce in a nested module
  divergent  rank ``--odd`` blocks on a queue.get() the others never feed; ``--stop`` rank SIGSTOPs itself
  early      rank ``--odd`` leaves the loop early and waits in its own code; the others all_reduce
  same       every rank waits in recv() from its right neighbour: all in the same op at the same line
  p2p        the same with irecv(...).wait(): a C++ wait right under the user's line
  pipeline   each rank waits in recv() for the gradient of rank+1; the last stage, rank ``--odd``,
             went to a barrier() instead of sending it
  idle       no rank communicates: every rank waits on an Event (compute/data-loading stand-in)
  async      NCCL's shape on gloo: all_reduce(async_op=True) every step, waited on 8 steps later;
             rank ``--odd`` blocks on a queue at step 3 while the others run on to step 11 and wait
             there in work.wait(): the progress counter ``step`` names the laggard
  partial    mark ready, then init_process_group: with fewer ranks started than WORLD_SIZE every
             rank waits there for the ones that never came (see hang_envlaunch.py)

``--loader`` gives rank 0 a live DataLoader worker (a child that inherited RANK: not a rank).
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from _common import mark_ready


class Reducer(torch.nn.Module):
    """A nested module whose forward issues the collective (a shape seen in real code)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sync = Reducer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sync(x * 2)


def sync_metrics() -> None:
    dist.barrier()


def run_async(rank: int, odd: int) -> None:
    """Collectives issued without waiting, waited on later, as NCCL runs them on the CPU."""
    pending: list[dist.Work] = []
    for step in range(1000):
        if rank == odd and step == 3:
            mark_ready(f"rank{rank}")
            queue.Queue().get()  # a data item that never comes
        work = dist.all_reduce(torch.ones(4), async_op=True)
        assert work is not None
        pending.append(work)
        if len(pending) > 8:
            if step == 11:
                mark_ready(f"rank{rank}")
            pending.pop(0).wait()


def heartbeat(stop: threading.Event) -> None:
    """A background thread that must not be mistaken for the main thread."""
    while not stop.wait(timeout=3600):
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True)
    p.add_argument("--odd", type=int, default=-1)
    p.add_argument("--stop", type=int, default=-1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--loader", action="store_true")
    p.add_argument(
        "--die-first-attempt", type=int, default=-1, help="this rank exits on torchrun's attempt 0"
    )
    p.add_argument("--api-key", default="", help="a secret on the command line, for redaction tests")
    p.add_argument("--pg-timeout", type=float, default=600.0, help="gloo timeout: how long the hang lasts")
    a = p.parse_args()
    api_key = a.api_key  # a secret-named local, for redaction tests
    auth_header = f"Bearer {os.environ.get('HANG_SECRET_TOKEN', 'none')}"
    if a.mode == "partial":
        mark_ready(f"rank{os.environ['RANK']}")
    dist.init_process_group("gloo", timeout=timedelta(seconds=a.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = None
    if a.loader and rank == 0:
        data = torch.utils.data.TensorDataset(torch.ones(64, 4))
        loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
        batches = iter(loader)
        next(batches)  # the worker process is alive from here on
    stop = threading.Event()
    threading.Thread(target=heartbeat, args=(stop,), name="heartbeat", daemon=True).start()
    model = Model()
    if a.mode == "async":
        run_async(rank, a.odd)
    for step in range(a.steps):
        x = torch.ones(4)
        last = step == a.steps - 1
        if not last:
            model(x)
            continue
        mark_ready(f"rank{rank}")
        if rank == a.stop:
            os.kill(os.getpid(), signal.SIGSTOP)
        if a.mode == "mismatch" and rank == a.odd:
            sync_metrics()
        elif a.mode == "divergent" and rank == a.odd:
            queue.Queue().get()
        elif a.mode == "early" and rank == a.odd:
            threading.Event().wait()
        elif a.mode == "same":
            buf = torch.zeros(4)
            dist.recv(buf, src=(rank + 1) % world)
        elif a.mode == "pipeline":
            if rank == a.odd:
                sync_metrics()
            else:
                grad = torch.zeros(4)
                dist.recv(grad, src=rank + 1)
        elif a.mode == "p2p":
            req = dist.irecv(torch.zeros(4), src=(rank + 1) % world)
            assert req is not None
            req.wait()
        elif a.mode == "idle":
            threading.Event().wait()
        else:
            model(x)
    del api_key, auth_header, batches
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
