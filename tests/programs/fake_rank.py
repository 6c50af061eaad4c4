"""A stand-in rank (no torch, starts in milliseconds): optionally starts a worker child
that inherits its environment, marks itself ready, then blocks until killed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from _common import mark_ready


def main() -> None:
    if "--worker" in sys.argv:
        threading.Event().wait()
        return
    worker = None
    if "--with-worker" in sys.argv:
        worker = subprocess.Popen([sys.executable, __file__, "--worker"])
    if "--exit" in sys.argv:
        return
    rank = (
        os.environ.get("RANK")
        or os.environ.get("SLURM_PROCID")
        or os.environ.get("OMPI_COMM_WORLD_RANK")
        or os.environ.get("PMI_RANK")
    )
    mark_ready(f"rank{rank}")
    threading.Event().wait()
    del worker


if __name__ == "__main__":
    main()
