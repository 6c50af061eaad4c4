"""Build NCCL-format flight-recorder dumps with our own values (no GPU here).

The layout is the one ``FlightRecorder::dump`` writes (version "2.10", the same
code that produced the gloo dumps next to this file on CPU): a pickled dict of
version, pg_config {pg name: {name, desc, ranks (a string)}}, pg_status,
entries [...] and nccl_comm_state. Run ``python build_nccl_dumps.py`` to
regenerate ``nccl_dtype/``, ``nccl_partial/`` and ``nccl_skip_step/``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TORCH = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def entry(
    seq: int,
    op: str,
    *,
    state: str,
    dtype: str = "Float",
    size: int = 1024,
    line: int = 88,
    record_id: int | None = None,
    pg: tuple[str, str] = ("0", "default_pg"),
    pg_id: int = 0,
) -> dict[str, Any]:
    return {
        "record_id": seq - 1 if record_id is None else record_id,
        "pg_id": pg_id,
        "process_group": pg,
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": op,
        "time_created_ns": 1_700_000_000_000_000_000 + seq * 1_000_000,
        "input_sizes": [[size]],
        "input_dtypes": [dtype],
        "output_sizes": [[size]],
        "output_dtypes": [dtype],
        "state": state,
        "time_discovered_started_ns": None
        if state == "scheduled"
        else 1_700_000_000_000_000_000 + seq * 1_000_000 + 5,
        "time_discovered_completed_ns": 1_700_000_000_000_000_000 + seq * 1_000_000 + 9
        if state == "completed"
        else None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
        "frames": [
            {"name": "all_reduce", "filename": TORCH, "line": 2950},
            {"name": "train_step", "filename": "/home/alice/train.py", "line": line},
            {"name": "main", "filename": "/home/alice/train.py", "line": 140},
        ],
    }


def dump(entries: list[dict[str, Any]], world: int, last_done: int) -> dict[str, Any]:
    ranks = ", ".join(str(r) for r in range(world))
    return {
        "version": "2.10",
        "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": f"[{ranks}]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": max(e["collective_seq_id"] for e in entries),
                "last_started_collective": max(e["collective_seq_id"] for e in entries),
                "last_completed_collective": last_done,
            }
        },
        "entries": entries,
        "nccl_comm_state": {},
    }


def write(dirname: str, rank: int, data: dict[str, Any]) -> None:
    out = HERE / dirname
    out.mkdir(exist_ok=True)
    (out / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(data, protocol=2))


def main() -> None:
    # 4 ranks; collective #7: rank 2 all-reduces bf16 gradients while the others send fp32.
    for rank in range(4):
        es = [entry(s, "nccl:all_reduce", state="completed") for s in range(1, 7)]
        es.append(
            entry(
                7,
                "nccl:all_reduce",
                state="started",
                dtype="BFloat16" if rank == 2 else "Float",
                line=91 if rank == 2 else 88,
            )
        )
        write("nccl_dtype", rank, dump(es, 4, 6))
    # world of 4, only ranks 0 and 1 dumped; their ring buffers kept different windows.
    for rank, first in ((0, 3), (1, 5)):
        es = [entry(s, "nccl:all_reduce", state="completed", record_id=s) for s in range(first, 10)]
        es.append(entry(10, "nccl:all_gather", state="started", record_id=10))
        write("nccl_partial", rank, dump(es, 4, 9))
    # 4 ranks, 4 all_reduces a step (sizes 65536, 4096, 256, 1), then a final barrier; rank 1 skipped
    # one step (`continue` on an empty batch), so its barrier is #193 where the others all-reduce.
    for rank in range(4):
        write("nccl_skip_step", rank, skip_step_dump(steps=48 if rank == 1 else 49))


def skip_step_dump(steps: int) -> dict[str, Any]:
    """``steps`` steps of 4 all_reduces, then the barrier; the last 40 entries, as a ring buffer keeps."""
    sizes = (65536, 4096, 256, 1)
    es = [
        entry(s * 4 + k + 1, "nccl:all_reduce", state="completed", size=sizes[k], line=30 + k)
        for s in range(steps)
        for k in range(4)
    ]
    es.append(entry(steps * 4 + 1, "nccl:all_reduce_barrier", state="scheduled", size=1, line=52))
    for e in es:
        if e["collective_seq_id"] >= 193:  # the first collective rank 1 and the others do not share
            e.update(state="scheduled", retired=False, time_discovered_started_ns=None)
            e["time_discovered_completed_ns"] = None
    return dump(es[-40:], 4, 192)


if __name__ == "__main__":
    main()
