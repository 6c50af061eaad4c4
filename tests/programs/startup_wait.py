"""A rank that marks itself ready, then joins the job's process group and waits there forever.

Started with a world larger than the ranks started, or with one rank never launched, it waits in
``init_process_group`` for the ranks that never come: a job that never started.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import torch.distributed as dist
from _common import mark_ready


def main() -> None:
    mark_ready(f"rank{os.environ.get('RANK', '?')}")
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    dist.barrier()
    threading.Event().wait()


if __name__ == "__main__":
    main()
