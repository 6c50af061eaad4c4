"""Which communication backend a rank uses, read from outside the process.

NCCL and gloo hang differently (see skill/hangs.md#nccl-hangs), so the verdict must know
which one a job runs, and it must know it without touching the job. The signs, from the
torch 2.13 and NCCL sources and checked on live processes:

- thread names: every ProcessGroupNCCL starts ``pt_nccl_watchdg`` and ``pt_nccl_heartbt``
  (not under ``TORCH_NCCL_BLOCKING_WAIT=1``); every ProcessGroupGloo runs
  ``pt_gloo_runloop`` threads and a ``gloo_tcp_loop``. Definitive, and cheap to read.
- ``/dev/shm/nccl-*`` mapped: an NCCL communicator was set up.
- ``/dev/nvidia*`` open or mapped, ``libcuda.so`` mapped: a CUDA context exists. A CPU build
  of torch (no ``libtorch_cuda.so``) cannot run NCCL at all.
- ``libnccl`` / ``libtorch_cuda`` mapped alone prove only a CUDA build of torch, not NCCL.
- ``TORCH_NCCL_*`` / ``NCCL_*`` in the environment given at exec: a hint, never proof.

This module is pure: the runtime layer reads /proc and hands over the text; native frames,
when a dump has them, say the same thing for a job whose /proc was not read.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rankscope.models.core import Backend, Job, RankStack

NCCL_THREADS = ("pt_nccl_watchdg", "pt_nccl_heartbt")
GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")


@dataclass(frozen=True)
class ProcessSigns:
    """What /proc shows of one rank: thread names, mapped paths, open fd targets, environment."""

    threads: tuple[str, ...] = ()
    mapped: frozenset[str] = field(default_factory=frozenset)
    fds: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


def _count(names: Iterable[str], wanted: tuple[str, ...]) -> int:
    return sum(1 for n in names if n.startswith(wanted))


def rank_backend(signs: ProcessSigns) -> tuple[Backend, list[str]]:
    """One rank's backend and the signs that decided it (short, one per sign)."""
    evidence: list[str] = []
    nccl_pg = _count(signs.threads, ("pt_nccl_watchdg",))
    gloo = _count(signs.threads, GLOO_THREADS)
    nccl_shm = any("/dev/shm/nccl-" in m for m in signs.mapped)
    gpu_fds = sum(1 for f in signs.fds if f.startswith("/dev/nvidia"))
    cuda_build = any("libtorch_cuda" in m for m in signs.mapped)
    cuda_ctx = gpu_fds > 0 or any(m.startswith("/dev/nvidia") or "libcuda.so" in m for m in signs.mapped)
    if nccl_pg:
        evidence.append(f"{nccl_pg} pt_nccl_watchdg thread(s): {nccl_pg} NCCL process group(s)")
    if nccl_shm:
        evidence.append("/dev/shm/nccl-* mapped: an NCCL communicator is set up")
    if gloo:
        evidence.append(f"{gloo} gloo thread(s) (pt_gloo_runloop, gloo_tcp_loop)")
    nccl = bool(nccl_pg or nccl_shm)
    if nccl and gloo:
        return "mixed", evidence
    if nccl:
        return "nccl", evidence
    blocking = signs.env.get("TORCH_NCCL_BLOCKING_WAIT", "") in ("1", "true", "True")
    if cuda_ctx and blocking:
        evidence.append(
            "a CUDA context and TORCH_NCCL_BLOCKING_WAIT=1 (which starts no NCCL watchdog thread)"
        )
        return ("mixed" if gloo else "nccl"), evidence
    if gloo:
        if cuda_ctx:
            evidence.append(f"a CUDA context ({gpu_fds} /dev/nvidia* fds) but no NCCL process group")
        return "gloo", evidence
    if not cuda_build and signs.mapped:
        return "unknown", ["a CPU build of torch (no libtorch_cuda mapped): not NCCL"]
    if cuda_ctx:
        return "unknown", [f"a CUDA context ({gpu_fds} /dev/nvidia* fds) but no process group thread yet"]
    return "unknown", evidence


def job_backend_of(per_rank: Mapping[int, tuple[Backend, list[str]]]) -> tuple[Backend | None, list[str]]:
    """The job's backend from its ranks': one answer when they agree, ``mixed`` when they do not."""
    known = {pid: b for pid, (b, _) in per_rank.items() if b != "unknown"}
    if not per_rank:
        return None, []
    if not known:
        first = next(iter(per_rank.values()))
        return "unknown", first[1][:1]
    kinds = Counter(known.values())
    backend: Backend = next(iter(kinds)) if len(kinds) == 1 else "mixed"
    sample_pid = next(pid for pid, b in known.items() if b == backend or backend == "mixed")
    evidence = [f"pid {sample_pid}: {line}" for line in per_rank[sample_pid][1][:2]]
    if len(kinds) > 1:
        evidence.append("ranks differ: " + ", ".join(f"{n} {b}" for b, n in sorted(kinds.items())))
    elif len(known) > 1:
        evidence.append(f"the same on all {len(known)} ranks read")
    return backend, evidence


_NCCL_NATIVE = re.compile(
    r"ProcessGroupNCCL|libnccl|\bnccl[A-Z]|libcudart|libcuda\.so|\bcuda[A-Z]|\bcu[A-Z][a-z]+[A-Z]"
)


def job_backend(job: Job, stacks: Iterable[RankStack]) -> Backend | None:
    """The job's backend: what the shell read from /proc, else what native frames show
    (ProcessGroupNCCL, libnccl, CUDA calls; ProcessGroupGloo, gloo::)."""
    if job.backend not in (None, "unknown"):
        return job.backend
    seen: set[str] = set()
    for stack in stacks:
        if stack.backend not in (None, "unknown"):
            seen.add(str(stack.backend))
            continue
        for thread in stack.threads:
            for frame in thread.frames:
                if not frame.native:
                    continue
                if _NCCL_NATIVE.search(frame.function) or _NCCL_NATIVE.search(frame.file):
                    seen.add("nccl")
                elif "ProcessGroupGloo" in frame.function or "gloo::" in frame.function:
                    seen.add("gloo")
    if not seen:
        return job.backend
    return "mixed" if len(seen) > 1 else ("nccl" if "nccl" in seen else "gloo")


__all__ = ["GLOO_THREADS", "NCCL_THREADS", "ProcessSigns", "job_backend", "job_backend_of", "rank_backend"]
