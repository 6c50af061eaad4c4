"""Starts stand-in ranks the way a given launcher would, environment and all.

    fake_launcher.py KIND N WORLD [--exit-rank R] [--reap] [--shell] [extra rank args...]

KIND: torchrun | slurm | mpi | pmi | env. ``--exit-rank`` makes that rank exit at once
(left a zombie unless ``--reap``); ``--shell`` puts a bash wrapper between the launcher
and each rank (the wrapper carries RANK too but is no Python process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from _common import mark_ready

HERE = Path(__file__).resolve().parent


def env_for(kind: str, rank: int, n: int, world: int) -> dict[str, str]:
    env = dict(os.environ)
    port = env.get("MASTER_PORT", "29500")
    if kind == "torchrun":
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(n),
            GROUP_RANK="0",
            TORCHELASTIC_RUN_ID=f"fake-{port}",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
    elif kind == "slurm":
        env.update(
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS=str(world),
            SLURM_JOB_ID=f"77{port}",
            SLURM_STEP_ID="0",
        )
    elif kind == "mpi":
        env.update(
            OMPI_COMM_WORLD_RANK=str(rank),
            OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
            OMPI_COMM_WORLD_SIZE=str(world),
            PMIX_NAMESPACE=f"prterun-{port}",
        )
    elif kind == "pmi":
        env.update(PMI_RANK=str(rank), PMI_SIZE=str(world), PMI_JOBID=f"pmi-{port}")
    else:
        env.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    return env


def main() -> None:
    kind, n, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rest = sys.argv[4:]
    exit_rank = int(rest[rest.index("--exit-rank") + 1]) if "--exit-rank" in rest else -1
    reap = "--reap" in rest
    shell = "--shell" in rest
    extra = [
        a
        for i, a in enumerate(rest)
        if a not in ("--reap", "--shell", "--exit-rank") and (i == 0 or rest[i - 1] != "--exit-rank")
    ]
    procs = []
    for rank in range(n):
        argv = [
            sys.executable,
            str(HERE / "fake_rank.py"),
            *extra,
            *(["--exit"] if rank == exit_rank else []),
        ]
        if shell:  # bash stays the parent: `"$@"; exit $?` keeps it from exec'ing python
            argv = ["bash", "-c", '"$@"; exit $?', "wrapper", *argv]
        procs.append(subprocess.Popen(argv, env=env_for(kind, rank, n, world)))
    if reap:
        for p in procs:
            threading.Thread(target=p.wait, daemon=True).start()
    mark_ready("launched")
    threading.Event().wait()


if __name__ == "__main__":
    main()
