"""A launcher that sets RANK/WORLD_SIZE itself (like accelerate or a shell script) but
starts only ``--started`` of ``--world`` ranks: the others never come up, as when a node
is missing. The started ranks wait in init_process_group."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=3)
    p.add_argument("--started", type=int, default=2)
    a = p.parse_args()
    here = Path(__file__).resolve().parent
    procs = []
    for rank in range(a.started):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.world))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(here / "hang_collectives.py"), "--mode", "partial"], env=env
            )
        )
    for proc in procs:
        proc.wait()


if __name__ == "__main__":
    main()
