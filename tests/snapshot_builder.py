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


@dataclass
class _Seg:
    address: int
    size: int
    segment_type: str
    blocks: dict[int, tuple[int, int, list[dict[str, Any]]]] = field(
        default_factory=dict
    )  # addr -> (size, requested, frames)


class SnapshotBuilder:
    """Records allocator events for one device and renders the snapshot dict."""

    def __init__(self, expandable_segments: bool = False) -> None:
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
            s = self.segment(max(size, 2 * MiB if size <= MiB else size), "small" if size <= MiB else "large")
            addr = s.address
        s.blocks[addr] = (size, requested if requested is not None else size, frames)
        self._event("alloc", addr=addr, size=size, frames=frames)
        return addr

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
        }

    def dump(self, path: Path, device: int = 0) -> Path:
        with open(path, "wb") as fh:
            pickle.dump(self.build(device), fh)
        return path
