"""Build CUDA memory snapshots in the exact ``torch.cuda.memory._dump_snapshot`` layout.

A tiny first-fit allocator replays what the caching allocator would record:
``segment_alloc`` when it cudaMallocs a segment, ``alloc`` / ``free_requested``
/ ``free_completed`` per block, ``oom`` with ``device_free``; ``build()``
returns the dict ``_snapshot()`` returns (segments with blocks and frames,
device_traces, allocator_settings), so the end state always agrees with the
trace. Keys follow torch/csrc/cuda/Module.cpp and the ``_snapshot`` docstring.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
GiB = 1024 * MiB

ALLOC_FRAME = {
    "filename": "??",
    "line": 0,
    "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
}
TORCH_FRAME = {
    "filename": "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
    "line": 125,
    "name": "forward",
}
STDLIB_FRAME = {"filename": "/usr/lib/python3.11/threading.py", "line": 1045, "name": "_bootstrap_inner"}


def user_frames(filename: str, line: int, name: str) -> list[dict[str, Any]]:
    """A stack innermost first: allocator, torch, the user line, the stdlib below it."""
    return [ALLOC_FRAME, TORCH_FRAME, {"filename": filename, "line": line, "name": name}, STDLIB_FRAME]


def _native(name: str, filename: str = "??") -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": 0}


NATIVE_TOP = [
    _native("torch::unwind::unwind()"),
    _native("torch::CapturedTraceback::gather(bool, bool, bool)"),
    _native("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    _native(
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)",
        "CUDACachingAllocator.cpp",
    ),
    _native("at::detail::empty_strided_cuda(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::ScalarType)"),
    _native("PyObject_Vectorcall"),
]
"""The C++ frames a real snapshot puts first (symbolized as on the H200 capture)."""
NATIVE_INTERPRETER = [
    _native("_PyEval_EvalFrameDefault"),
    _native("PyEval_EvalCode"),
    _native("Py_RunMain"),
    _native("__libc_start_main"),
    _native("_start"),
]
"""The interpreter's frames, which a real snapshot puts after the innermost Python frame."""


def real_frames(*python: tuple[str, int, str]) -> list[dict[str, Any]]:
    """A stack in the layout of a real CUDA snapshot (``_record_memory_history(stacks='all')``):
    native frames first, the innermost Python frame, the interpreter's native frames, then the rest of
    the Python frames, innermost first. ``python`` is (filename, line, function), innermost first."""
    py = [{"name": name, "filename": filename, "line": line} for filename, line, name in python]
    return [*NATIVE_TOP, *py[:1], *NATIVE_INTERPRETER, *py[1:]]


@dataclass
class _Seg:
    address: int
    size: int
    segment_type: str
    blocks: dict[int, tuple[int, int, list[dict[str, Any]]]] = field(
        default_factory=dict
    )  # addr -> (size, requested, frames)


class DeviceFull(Exception):
    """An allocation the device cannot hold even with the cache freed: where the OOM is recorded."""

    def __init__(self, size: int, frames: list[dict[str, Any]]) -> None:
        super().__init__(f"cannot allocate {size} bytes")
        self.size, self.frames = size, frames


class SnapshotBuilder:
    """Records allocator events for one device and renders the snapshot dict."""

    def __init__(self, expandable_segments: bool = False, capacity: int | None = None) -> None:
        self.capacity = capacity  # the device's bytes: past them, the cache is freed before a new segment
        self.segments: list[_Seg] = []
        self.trace: list[dict[str, Any]] = []
        self.next_addr = 0x7F0000000000
        self.time_us = 1_700_000_000_000_000
        self.expandable = expandable_segments

    def _event(self, action: str, **kw: Any) -> None:
        self.time_us += 10
        entry: dict[str, Any] = {
            "action": action,
            "size": kw.pop("size"),
            "stream": 0,
            "time_us": self.time_us,
            "compile_context": "N/A",
            "user_metadata": "",
        }
        entry.update(kw)
        entry.setdefault("frames", [])
        self.trace.append(entry)

    def segment(self, size: int, segment_type: str = "large") -> _Seg:
        seg = _Seg(self.next_addr, size, segment_type)
        self.next_addr += size + 0x100000
        self.segments.append(seg)
        self._event("segment_alloc", addr=seg.address, size=size)
        return seg

    def free_segment(self, seg: _Seg) -> None:
        assert not seg.blocks
        self.segments.remove(seg)
        self._event("segment_free", addr=seg.address, size=seg.size)

    def alloc(
        self, size: int, frames: list[dict[str, Any]], seg: _Seg | None = None, requested: int | None = None
    ) -> int:
        """Place a block first-fit in ``seg`` (or any segment of the right pool; a new one if none fits)."""
        candidates = (
            [seg]
            if seg is not None
            else [s for s in self.segments if s.segment_type == ("small" if size <= MiB else "large")]
        )
        for s in candidates:
            addr = self._fit(s, size)
            if addr is not None:
                break
        else:
            seg_size = max(size, 2 * MiB if size <= MiB else size)
            self._make_room(seg_size, size, frames)
            s = self.segment(seg_size, "small" if size <= MiB else "large")
            addr = s.address
        s.blocks[addr] = (size, requested if requested is not None else size, frames)
        self._event("alloc", addr=addr, size=size, frames=frames)
        return addr

    def reserved(self) -> int:
        return sum(s.size for s in self.segments)

    def _make_room(self, seg_size: int, size: int, frames: list[dict[str, Any]]) -> None:
        """Past the device's capacity, free the cache first, as the caching allocator does when
        cudaMalloc fails; still past it, the allocation fails (:class:`DeviceFull`)."""
        if self.capacity is None or self.reserved() + seg_size <= self.capacity:
            return
        self.release_cached()
        if self.reserved() + seg_size > self.capacity:
            raise DeviceFull(size, frames)

    @staticmethod
    def _fit(seg: _Seg, size: int) -> int | None:
        cursor = seg.address
        for addr in sorted(seg.blocks):
            if addr - cursor >= size:
                return cursor
            cursor = addr + seg.blocks[addr][0]
        return cursor if seg.address + seg.size - cursor >= size else None

    def free(self, addr: int) -> None:
        for s in self.segments:
            if addr in s.blocks:
                size = s.blocks.pop(addr)[0]
                self._event("free_requested", addr=addr, size=size)
                self._event("free_completed", addr=addr, size=size)
                return
        raise KeyError(addr)

    def release_cached(self) -> None:
        """Free every wholly unused segment, as the caching allocator does before it raises OOM."""
        for seg in [s for s in self.segments if not s.blocks]:
            self.free_segment(seg)

    def oom(self, size: int, device_free: int, frames: list[dict[str, Any]] | None = None) -> None:
        self._event("oom", device_free=device_free, size=size, frames=frames or [])

    def build(self, device: int = 0) -> dict[str, Any]:
        segments = []
        for s in self.segments:
            blocks: list[dict[str, Any]] = []
            cursor = s.address
            allocated = 0
            for addr in sorted(s.blocks):
                size, requested, frames = s.blocks[addr]
                if addr > cursor:
                    blocks.append(
                        {
                            "address": cursor,
                            "size": addr - cursor,
                            "requested_size": 0,
                            "state": "inactive",
                            "frames": [],
                        }
                    )
                blocks.append(
                    {
                        "address": addr,
                        "size": size,
                        "requested_size": requested,
                        "state": "active_allocated",
                        "frames": frames,
                    }
                )
                allocated += size
                cursor = addr + size
            if cursor < s.address + s.size:
                blocks.append(
                    {
                        "address": cursor,
                        "size": s.address + s.size - cursor,
                        "requested_size": 0,
                        "state": "inactive",
                        "frames": [],
                    }
                )
            segments.append(
                {
                    "device": device,
                    "address": s.address,
                    "total_size": s.size,
                    "allocated_size": allocated,
                    "active_size": allocated,
                    "requested_size": sum(b["requested_size"] for b in blocks),
                    "stream": 0,
                    "segment_type": s.segment_type,
                    "segment_pool_id": (0, 0),
                    "is_expandable": self.expandable,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        traces: list[list[dict[str, Any]]] = [[] for _ in range(device + 1)]
        traces[device] = list(self.trace)
        return {
            "segments": segments,
            "device_traces": traces,
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if self.expandable else "",
                "expandable_segments": self.expandable,
                "max_split_size": -1,
                "garbage_collection_threshold": 0.0,
            },
            "external_annotations": [],
        }

    def dump(self, path: Path, device: int = 0) -> Path:
        with open(path, "wb") as fh:
            pickle.dump(self.build(device), fh)
        return path


# ---------------------------------------------------------------- a dead OOM job

LM_DIR = "/workspace/lm"
LOGITS = 2 * 4096 * 128_000 * 2  # 1.95 GiB: one step's bf16 logits (batch 2, sequence 4096, vocab 128000)
ACTIVATION = 11 * GiB  # each of four blocks' saved activations
CAPACITY = 79.15 * GiB


def _lm_stacks() -> dict[str, list[dict[str, Any]]]:
    """The stacks of the LM job's allocations, each built once (a snapshot's frames repeat)."""
    m, t = f"{LM_DIR}/model.py", f"{LM_DIR}/train.py"
    torch_mod = (
        "/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py",
        1786,
        "_call_impl",
    )
    linear = ("/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 134, "forward")
    autograd = (
        "/opt/torch/.venv/lib/python3.12/site-packages/torch/autograd/graph.py",
        841,
        "_engine_run_backward",
    )
    main = (t, 99, "<module>")
    return {
        "params": real_frames((m, 39, "__init__"), (t, 59, "main"), main),
        "optim": real_frames(
            ("/opt/torch/.venv/lib/python3.12/site-packages/torch/optim/adamw.py", 181, "_init_group"),
            (t, 80, "main"),
            main,
        ),
        "tokens": real_frames((t, 75, "main"), main),
        "act": real_frames(
            linear,
            torch_mod,
            (m, 17, "forward"),
            torch_mod,
            (m, 44, "forward"),
            torch_mod,
            (t, 77, "main"),
            main,
        ),
        "logits": real_frames(linear, torch_mod, (m, 48, "forward"), torch_mod, (t, 77, "main"), main),
        "grad": real_frames(autograd, (t, 79, "main"), main),
    }


def lm_step(b: SnapshotBuilder, stacks: dict[str, list[dict[str, Any]]], keep: bool) -> int | None:
    """One training step of the LM; returns the logits' address when this step keeps them."""
    tokens = b.alloc(64 * 1024, stacks["tokens"])
    acts = [b.alloc(ACTIVATION, stacks["act"]) for _ in range(4)]
    logits = b.alloc(LOGITS, stacks["logits"])
    b.free(acts.pop())  # backward through the last block first
    grad = b.alloc(LOGITS, stacks["grad"])
    b.free(grad)
    for a in reversed(acts):
        b.free(a)
    b.free(tokens)
    if keep:
        return logits
    b.free(logits)
    return None


def write_leak_job(folder: Path) -> list[Path]:
    """The snapshots of a 4-rank LM whose rank 3 keeps a view of every 10th step's logits.

    Every rank at step 50 (``snapshot-rankN-step50.pickle``), and rank 3 at its OOM in step 101's
    forward, allocating the logits (``snapshot-rank3-oom.pickle``): the traces run from the start of the job, as with
    ``_record_memory_history(max_entries=100000)``.
    """
    stacks = _lm_stacks()
    written: list[Path] = []
    for rank in range(4):
        b = SnapshotBuilder()
        b.alloc(4 * GiB, stacks["params"])
        for step in range(51):
            lm_step(b, stacks, keep=rank == 3 and step % 10 == 0)
            if step == 0:
                b.alloc(8 * GiB, stacks["optim"])
        written.append(b.dump(folder / f"snapshot-rank{rank}-step50.pickle"))
        if rank != 3:
            continue
        for step in range(51, 101):
            lm_step(b, stacks, keep=step % 10 == 0)
        b.alloc(64 * 1024, stacks["tokens"])
        for _ in range(4):
            b.alloc(ACTIVATION, stacks["act"])
        b.release_cached()
        reserved = sum(s.size for s in b.segments)
        b.oom(LOGITS, device_free=int(CAPACITY - reserved - 480 * MiB), frames=stacks["logits"])
        written.append(b.dump(folder / "snapshot-rank3-oom.pickle"))
    return written


# ------------------------------------------- one library line, several script lines

VENV = "/opt/torch/.venv/lib/python3.12/site-packages/torch"
_LINEAR = (f"{VENV}/nn/modules/linear.py", 134, "forward")
_CALL = (f"{VENV}/nn/modules/module.py", 1786, "_call_impl")
_BACKWARD = (f"{VENV}/autograd/graph.py", 841, "_engine_run_backward")


@dataclass(frozen=True)
class Forward:
    """A script line that runs the model: where it is, how often it runs, what it keeps.

    ``line`` in ``func`` of the script, called from ``caller`` (a line of main) when ``func`` is not
    main. A training forward (``train``) runs backward, which frees the activations; any other
    keeps every ``keep``-th output (0: none), with the activations of its forward too when
    ``graph`` (grad enabled, the output still attached).
    """

    line: int
    func: str = "main"
    caller: int | None = None
    every: int = 1
    keep: int = 0
    graph: bool = False
    train: bool = False
    activations: int = 8
    act_bytes: int = 256 * MiB
    out_bytes: int = 512 * MiB


@dataclass(frozen=True)
class Job:
    """Where a job's code lives and the lines of its model that allocate (model.py)."""

    script: str = "/workspace/lm/train.py"
    model: str = "/workspace/lm/model.py"
    block_line: int = 17
    loop_line: int = 44
    head_line: int = 48
    init_line: int = 39
    main_line: int = 99
    params_line: int = 59
    optim_line: int = 80


def forward_stacks(job: Job, fw: Forward) -> dict[str, list[dict[str, Any]]]:
    """The stacks of one script line's forward: its activations, its output, its backward."""
    outer = [(job.script, fw.line, fw.func)]
    if fw.caller is not None:
        outer.append((job.script, fw.caller, "main"))
    outer.append((job.script, job.main_line, "<module>"))
    block = (job.model, job.block_line, "forward")
    return {
        "act": real_frames(
            _LINEAR, _CALL, block, _CALL, (job.model, job.loop_line, "forward"), _CALL, *outer
        ),
        "out": real_frames(_LINEAR, _CALL, (job.model, job.head_line, "forward"), _CALL, *outer),
        "grad": real_frames(_BACKWARD, (job.script, fw.line + 2, fw.func), *outer[1:]),
    }


def run_forward(b: SnapshotBuilder, stacks: dict[str, list[dict[str, Any]]], fw: Forward, keep: bool) -> None:
    """One call of a forward: its activations, its output, then what it frees."""
    acts = [b.alloc(fw.act_bytes, stacks["act"]) for _ in range(fw.activations)]
    out = b.alloc(fw.out_bytes, stacks["out"])
    if fw.train:
        grad = b.alloc(fw.out_bytes, stacks["grad"])
        b.free(grad)
    if not (keep and fw.graph):
        for a in reversed(acts):
            b.free(a)
    if not keep:
        b.free(out)


def run_steps(
    b: SnapshotBuilder, job: Job, forwards: list[Forward], steps: range, counts: dict[int, int]
) -> None:
    """Steps of a job whose forwards all go through the same model lines; ``counts`` carries how
    many times each forward ran, so its every-``keep``-th call is kept across calls."""
    stacks = [forward_stacks(job, fw) for fw in forwards]
    for step in steps:
        for i, (fw, st) in enumerate(zip(forwards, stacks, strict=True)):
            if step % fw.every != fw.every - 1 and fw.every > 1:
                continue
            n = counts.get(i, 0)
            counts[i] = n + 1
            run_forward(b, st, fw, keep=fw.keep > 0 and n % fw.keep == fw.keep - 1)


def start_job(job: Job, params: int = 4 * GiB, optim: int = 8 * GiB) -> SnapshotBuilder:
    """A builder holding the model's parameters and optimizer states, as at the first step."""
    b = SnapshotBuilder()
    main = (job.script, job.main_line, "<module>")
    b.alloc(
        params,
        real_frames((job.model, job.init_line, "__init__"), (job.script, job.params_line, "main"), main),
    )
    b.alloc(
        optim,
        real_frames(
            (f"{VENV}/optim/adamw.py", 181, "_init_group"), (job.script, job.optim_line, "main"), main
        ),
    )
    return b


def out_of_memory(b: SnapshotBuilder, job: Job, fw: Forward, capacity: float) -> None:
    """The forward ``fw`` fails allocating its output: the allocator frees its cache and records the OOM."""
    stacks = forward_stacks(job, fw)
    for _ in range(fw.activations):
        b.alloc(fw.act_bytes, stacks["act"])
    b.release_cached()
    reserved = sum(seg.size for seg in b.segments)
    b.oom(fw.out_bytes, device_free=max(0, int(capacity - reserved - 480 * MiB)), frames=stacks["out"])


if __name__ == "__main__":  # regenerates tests/data/postmortem/oom_leak's snapshots
    import sys

    for p in write_leak_job(Path(sys.argv[1])):
        print(p, p.stat().st_size)
