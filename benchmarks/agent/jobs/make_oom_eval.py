"""Writes the snapshots of incident dead_fsdp_oom_eval (never shown to the agent).

    PYTHONPATH=tools python benchmarks/agent/jobs/make_oom_eval.py

The job is the code in the incident's leftovers (train.py, model.py): a 4-rank FSDP2 LM whose
evaluate() runs every 25 steps with grad enabled and, on rank 0, appends a view of the logits.
The allocator's events are replayed with tests/snapshot_builder.py (the exact `_dump_snapshot`
layout, the stacks in the layout of a real snapshot), at the lines of that code: every rank's
snapshot after step 60, and rank 0's at its OOM in step 75's training forward.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from tests.snapshot_builder import (  # noqa: E402
    VENV,
    DeviceFull,
    Forward,
    GiB,
    Job,
    MiB,
    SnapshotBuilder,
    real_frames,
    run_steps,
)

LEFTOVERS = Path(__file__).resolve().parents[1] / "incidents" / "dead_fsdp_oom_eval" / "leftovers"
DEVICE = int(79.15 * GiB) - 480 * MiB  # what PyTorch can have: the CUDA context and NCCL take the rest
SNAPSHOT_AT, OOM_AT = 60, 75
PARAMS = int(4.3 * GiB)  # a rank's quarter of 4.3 B fp32 parameters; AdamW keeps twice that


def line_of(name: str, text: str, after: str | None = None) -> int:
    """The line of the job's code that holds ``text`` (after the line holding ``after``)."""
    lines = (LEFTOVERS / name).read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if after in x) if after else 0
    return next(i + 1 for i, x in enumerate(lines) if i >= start and text in x)


JOB = Job(
    script="/workspace/lm/train.py",
    model="/workspace/lm/model.py",
    block_line=line_of("model.py", "return x + self.mlp"),
    loop_line=line_of("model.py", "x = block(x)"),
    head_line=line_of("model.py", "logits = self.head"),
    main_line=line_of("train.py", "        main()"),
)
TRAIN = Forward(
    line=line_of("train.py", "logits = model(tokens)"), train=True, activations=16,
    act_bytes=int(2.1875 * GiB), out_bytes=2 * 4096 * 128_000 * 2,
)  # fmt: skip
EVAL = dict(
    line=line_of("train.py", "logits = model(val_tokens)"), func="evaluate",
    caller=line_of("train.py", "evaluate(model", after="def main"), every=25, graph=True, activations=16,
    act_bytes=int(0.5625 * GiB), out_bytes=2 * 1024 * 128_000 * 2,
)  # fmt: skip


def start(rank: int) -> SnapshotBuilder:
    """The sharded parameters (fully_shard) and the optimizer states (AdamW's first step)."""
    b = SnapshotBuilder(capacity=DEVICE)
    main = (JOB.script, JOB.main_line, "<module>")
    shard = (f"{VENV}/distributed/fsdp/_fully_shard/_fsdp_param.py", 362, "_init_sharded_param")
    block = line_of("train.py", "fully_shard(block)")
    for _ in range(16):
        b.alloc(PARAMS // 16, real_frames(shard, (JOB.script, block, "main"), main))
    b.alloc(64 * 1024, real_frames((JOB.script, line_of("train.py", "val_tokens = "), "main"), main))
    return b


def write(folder: Path = LEFTOVERS) -> list[Path]:
    written: list[Path] = []
    for rank in range(4):
        b = start(rank)
        forwards = [TRAIN, Forward(**EVAL, keep=1 if rank == 0 else 0)]  # type: ignore[arg-type]
        counts: dict[int, int] = {}
        run_steps(b, JOB, forwards[:1], range(1), counts)
        optim = line_of("train.py", "opt.step()")
        adamw = (f"{VENV}/optim/adamw.py", 181, "_init_group")
        b.alloc(
            2 * PARAMS,
            real_frames(adamw, (JOB.script, optim, "main"), (JOB.script, JOB.main_line, "<module>")),
        )
        run_steps(b, JOB, forwards, range(1, SNAPSHOT_AT + 1), counts)
        written.append(b.dump(folder / f"snapshot-rank{rank}-step{SNAPSHOT_AT}.pickle"))
        if rank == 0:
            try:
                run_steps(b, JOB, forwards, range(SNAPSHOT_AT + 1, OOM_AT + 1), counts)
            except DeviceFull as full:  # where the allocator gave up: recorded as torch records it
                print(f"rank 0 ran out of memory at step {max(counts.get(0, 0) - 1, 0)}", file=sys.stderr)
                b.oom(full.size, device_free=int(DEVICE - b.reserved()), frames=full.frames)
            written.append(b.dump(folder / "snapshot-rank0-oom.pickle"))
    return written


if __name__ == "__main__":
    for path in write():
        print(path.name, path.stat().st_size)
