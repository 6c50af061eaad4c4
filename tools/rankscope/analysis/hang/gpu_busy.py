"""How busy each rank's GPU is: a stuck NCCL kernel spins its GPU at about 100%, a GPU whose
rank never launched the collective sits at about 0% (accelerate#3104, transformer-xl#10).

Pure: nvidia-smi's CSV and the ranks' open ``/dev/nvidiaN`` files come in, rank -> percent
goes out. The shell runs nvidia-smi (with a timeout) only on jobs that may use a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from rankscope.analysis.ranges import ranks_phrase

GPU_QUERY = "index,uuid,utilization.gpu"
"""``nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits``."""
APPS_QUERY = "pid,gpu_uuid"
"""``nvidia-smi --query-compute-apps=APPS_QUERY --format=csv,noheader,nounits``."""

BUSY_PCT = 80
IDLE_PCT = 10


def parse_gpus(text: str) -> dict[str, tuple[int, int | None]]:
    """uuid -> (index, utilisation %) from the --query-gpu CSV; [N/A] gives None."""
    out: dict[str, tuple[int, int | None]] = {}
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 3 or not cols[0].isdigit():
            continue
        util = int(cols[2]) if cols[2].isdigit() else None
        out[cols[1]] = (int(cols[0]), util)
    return out


def parse_apps(text: str) -> dict[int, list[str]]:
    """pid -> [gpu uuid] from the --query-compute-apps CSV."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 2 and cols[0].isdigit():
            out.setdefault(int(cols[0]), []).append(cols[1])
    return out


_MINOR = re.compile(r"^/dev/nvidia(\d+)$")


def rank_utilisation(
    gpus: Mapping[str, tuple[int, int | None]],
    apps: Mapping[int, list[str]],
    rank_pids: Mapping[int, int],
    rank_fds: Mapping[int, Sequence[str]],
) -> dict[int, int]:
    """rank -> utilisation % of the one GPU it uses: by nvidia-smi's pid, else by its /dev/nvidiaN
    (in a container nvidia-smi may list host pids). A rank on several GPUs is left out."""
    by_index = {index: util for index, util in gpus.values()}
    out: dict[int, int] = {}
    for rank, pid in rank_pids.items():
        uuids = set(apps.get(pid, ()))
        if len(uuids) == 1:
            util = gpus.get(next(iter(uuids)), (0, None))[1]
        else:
            minors = {int(m.group(1)) for f in rank_fds.get(rank, ()) if (m := _MINOR.match(f))}
            util = by_index.get(next(iter(minors))) if len(minors) == 1 else None
        if util is not None:
            out[rank] = util
    return out


def idle_minority(util: Mapping[int, int]) -> tuple[list[int], str] | None:
    """The ranks whose GPU idles while most ranks' GPUs spin, with the sentence that says so."""
    if len(util) < 3:
        return None
    busy = sorted(r for r, u in util.items() if u >= BUSY_PCT)
    idle = sorted(r for r, u in util.items() if u <= IDLE_PCT)
    if not idle or len(busy) * 2 <= len(util) or len(idle) >= len(busy):
        return None
    text = (
        f"GPU utilisation: {ranks_phrase(busy)} at {BUSY_PCT}% or more (spinning in a stuck kernel); "
        f"{ranks_phrase(idle)} at {max(util[r] for r in idle)}% or less (never launched it)"
    )
    return idle, text


__all__ = ["APPS_QUERY", "GPU_QUERY", "idle_minority", "parse_apps", "parse_gpus", "rank_utilisation"]
