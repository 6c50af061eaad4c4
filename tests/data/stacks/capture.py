"""Capture the py-spy JSON of real hung gloo jobs into this folder (run by hand, not by pytest).

    .venv/bin/python tests/data/stacks/capture.py [CASE ...]

Each case starts a real job from tests/programs, waits until every rank is blocked, and
writes ``<case>.json``: the discovered Job and, per rank, its state and the raw
``py-spy dump --json`` output; for frames in torch.compile's generated code, whose files live
in a temporary cache, also their source lines (``sources``). tests/test_stacks_analysis.py
replays them through the pure analysis.
"""

from __future__ import annotations

import json
import linecache
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tests.jobs import JobFactory, wait_for  # noqa: E402

from rankscope.capabilities import discovery  # noqa: E402
from rankscope.options import DumpOptions  # noqa: E402
from rankscope.runtime import pyspy  # noqa: E402

HERE = Path(__file__).resolve().parent

# case -> (launcher method, program, nproc, args, native, locals)
CASES: dict[str, tuple[str, str, int, list[str], bool, bool]] = {
    "mismatch_barrier": (
        "torchrun",
        "hang_collectives.py",
        3,
        ["--mode", "mismatch", "--odd", "2", "--loader"],
        False,
        False,
    ),
    "mismatch_barrier_native": (
        "torchrun",
        "hang_collectives.py",
        2,
        ["--mode", "mismatch", "--odd", "1"],
        True,
        False,
    ),
    "divergent_queue_stopped": (
        "torchrun",
        "hang_collectives.py",
        3,
        ["--mode", "divergent", "--odd", "1", "--stop", "2"],
        False,
        False,
    ),
    "early_exit_loop": (
        "torchrun",
        "hang_collectives.py",
        2,
        ["--mode", "early", "--odd", "0"],
        False,
        False,
    ),
    "same_recv": ("torchrun", "hang_collectives.py", 2, ["--mode", "same"], False, False),
    "ring_recv_locals": ("torchrun", "hang_collectives.py", 4, ["--mode", "same"], False, True),
    "pipeline_locals": (
        "torchrun",
        "hang_collectives.py",
        3,
        ["--mode", "pipeline", "--odd", "2"],
        False,
        True,
    ),
    "pipeline_schedule_skip": ("torchrun", "hang_pipeline.py", 3, ["--odd", "0"], False, False),
    "fsdp2_skip_forward": ("torchrun", "hang_fsdp2.py", 3, ["--odd", "1"], False, False),
    "compiled_wait_tensor": ("torchrun", "hang_compiled.py", 3, ["--odd", "1"], False, False),
    "idle": ("torchrun", "hang_collectives.py", 2, ["--mode", "idle"], False, False),
    "ddp_skip_backward": ("torchrun", "hang_ddp.py", 2, ["--odd", "1"], False, False),
    "ddp_skip_backward_native": ("torchrun", "hang_ddp.py", 2, ["--odd", "1"], True, False),
    "ddp_skip_backward_locals": ("torchrun", "hang_ddp.py", 2, ["--odd", "1"], False, True),
    "libcall_zero": ("torchrun", "hang_libcall.py", 4, ["--mode", "zero"], False, False),
    "libcall_fsdp2": ("torchrun", "hang_libcall.py", 4, ["--mode", "fsdp2"], False, False),
    "libcall_dcp": ("torchrun", "hang_libcall.py", 4, ["--mode", "dcp"], False, False),
    "libcall_zero_backward": (
        "torchrun",
        "hang_libcall.py",
        4,
        ["--mode", "zero", "--no-tail"],
        False,
        False,
    ),
    "skip_in_body": ("torchrun", "hang_skip_body.py", 4, ["--odd", "1"], False, False),
    "spawn_mismatch": ("python", "hang_spawn.py", 2, ["--nproc", "2", "--odd", "1"], False, True),
    "env_partial_world": ("python", "hang_envlaunch.py", 2, ["--world", "3", "--started", "2"], False, False),
}


def _blocked(stack: list[dict[str, Any]]) -> bool:
    """True once the main thread has left our program's own frames for a library call or a wait."""
    for thread in stack:
        if thread.get("thread_name") == "MainThread" or thread.get("os_thread_id") == thread.get("pid"):
            frames = thread.get("frames") or []
            py = [f for f in frames if f.get("module") is None]
            return bool(py) and "tests/programs" not in py[0].get("filename", "")
    return False


LOOK_BACK = 15
"""Lines read above each frame of the job's own code (the conditions and loops around a call)."""


def sources(raw: list[dict[str, Any]]) -> dict[str, str]:
    """The source lines the analysis reads, by ``file:line``: each frame of torch.compile's
    generated code (its cache is temporary), and the lines above each frame of the test programs
    (the rank conditions and loops around a call)."""
    out: dict[str, str] = {}
    for thread in raw:
        for f in thread.get("frames") or []:
            name, line = f.get("filename", ""), f.get("line")
            if not line:
                continue
            first = line if "/torchinductor_" in name else max(1, line - LOOK_BACK)
            if "/torchinductor_" in name or "tests/programs/" in name:
                for n in range(first, line + 1):
                    if text := linecache.getline(name, n):
                        out[f"{name}:{n}"] = text.rstrip("\n")
    return {k: v for k, v in out.items() if v.strip()}


def capture(case: str) -> None:
    method, program, nproc, args, native, locals_ = CASES[case]
    tmp = Path(tempfile.mkdtemp(prefix="rankscope-capture-"))
    factory = JobFactory(tmp)
    try:
        job_proc = getattr(factory, method)(program, nproc=nproc, args=args)
        job_proc.wait_ready(timeout=120)
        job = discovery.find_job(job_proc.pid)
        out: dict[str, Any] = {"case": case, "native": native, "locals": locals_, "ranks": []}

        def settled() -> bool:
            ok = True
            for r in job.ranks:
                state = discovery.proc_state(r.pid)
                if state in ("stopped", "tracing_stop"):
                    continue
                if not _blocked(pyspy.dump_raw(r.pid, DumpOptions(timeout=30))):
                    ok = False
            return ok

        wait_for(settled, 60, "every rank blocked", interval=0.5)
        time.sleep(0.5)  # let a SIGSTOP land
        job = discovery.find_job(job_proc.pid)
        out["job"] = json.loads(job.model_dump_json())
        for r in job.ranks:
            state = discovery.proc_state(r.pid)
            raw = None
            if state not in ("stopped", "tracing_stop", "zombie"):
                raw = pyspy.dump_raw(r.pid, DumpOptions(native=native, locals=locals_, timeout=60))
            out["ranks"].append({"rank": r.rank, "pid": r.pid, "host": r.host, "state": state, "pyspy": raw})
            out.setdefault("sources", {}).update(sources(raw or []))
        (HERE / f"{case}.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{case}: {len(job.ranks)} ranks captured")
    finally:
        factory.cleanup()


if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        capture(name)
