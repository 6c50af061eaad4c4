"""Progress that is not a counter: a rank's I/O, its kernel wait and its locals over the window.

A rank that writes a checkpoint to a slow file system stands at the same few lines with almost no
CPU: by its counters and its CPU it looks stopped, yet every byte it writes is progress. And a rank
that spins in ``while not os.path.exists(p): pass`` burns CPU at one line with nothing else moving.
The shell reads, for each rank's main thread (never the transport's threads: gloo's workers and
NCCL's proxy move bytes for the collectives, not for the rank), its I/O counters at both ends of
the window (/proc/PID/task/PID/io), where it sleeps in the kernel several times during the window
(state and wchan), and the repr of its own frames' locals at both looks. This module says which of
those moved.

Pure: the shell hands the readings in.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence

from rankscope.analysis.hang.counters import counter_key
from rankscope.analysis.hang.frames import is_internal_frame
from rankscope.analysis.units import fmt_bytes
from rankscope.models.core import Frame
from rankscope.models.progress import RankMotion

IO_MIN_BYTES = 32 * 1024
"""Bytes a rank's main thread must move over the window (read or written) for its I/O to count as
progress: a log line printed in a polling loop is not."""

MIN_BYTES_PER_CALL = 512
"""Bytes per read/write call below which moved characters (rchar, wchar) do not count unless they
reached storage: a loop that prints or polls a small file makes many tiny calls, a checkpoint write
makes large ones."""

FILE_WAIT_PCT = 50
"""Share of the kernel looks a rank must spend waiting on a file (D state, a file system or
writeback function) for that wait to count as I/O under way when no byte moved."""

_FILE_WAIT = re.compile(
    r"folio|page|writeback|dirty|bio|blk|io_schedule|bit_wait_io|fsync|sync_file|jbd2|ext4|xfs|btrfs|nfs|"
    r"rpc_|fuse|ovl_|filemap|generic_perform_write|vfs_|lock_page|wb_|flush"
)
_TIMER = re.compile(r"nanosleep|hrtimer|schedule_timeout|msleep")
_FUTEX = re.compile(r"futex")
_SOCKET = re.compile(r"^sk_|sock|tcp_|inet_|unix_|udp_|skb_|wait_woken")
_POLL = re.compile(r"poll|select|epoll")
_PIPE = re.compile(r"pipe")

KERNEL_WORDS = {
    "running": "running",
    "file": "in a file read or write",
    "timer": "sleeping in a timer",
    "futex": "on a futex (a lock or another thread)",
    "socket": "on a socket",
    "poll": "in poll/select",
    "pipe": "on a pipe",
    "other": "in the kernel",
}
"""How each kind of kernel wait reads in an answer."""

MAX_REPRS = 64
"""Locals of a rank's own frames kept per look (in memory only: only a loop condition's names leave)."""

MAX_REPR = 200
"""Characters of one local's repr kept."""


def kernel_kind(state: str, wchan: str) -> str:
    """What a thread waits on in the kernel, from its state letter and wchan: ``running``, ``file``,
    ``timer``, ``futex``, ``socket``, ``poll``, ``pipe`` or ``other``."""
    if not wchan:
        return "running" if state == "R" else ("file" if state == "D" else "other")
    for kind, pattern in (
        ("futex", _FUTEX),
        ("timer", _TIMER),
        ("pipe", _PIPE),
        ("socket", _SOCKET),
        ("poll", _POLL),
        ("file", _FILE_WAIT),
    ):
        if pattern.search(wchan):
            return kind
    return "file" if state == "D" else "other"


def kernel_shares(waits: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Kind of kernel wait -> % of the looks, most seen first."""
    if not waits:
        return {}
    seen = Counter(kernel_kind(state, wchan) for state, wchan in waits)
    return {kind: 100 * n // len(waits) for kind, n in seen.most_common()}


def io_moved(looks: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """The I/O counters that moved between the first and the last reading, and by how much."""
    if len(looks) < 2:
        return {}
    first, last = looks[0], looks[-1]
    return {k: last[k] - first[k] for k in first if k in last and last[k] > first[k]}


def io_bytes(io: Mapping[str, int]) -> tuple[int, int]:
    """(bytes read, bytes written) that count as progress: what reached storage (from the main thread,
    or from any thread of the process: an asynchronous checkpoint writer), or what passed through the
    main thread's calls large enough to be more than a poll or a log line."""
    calls = io.get("syscr", 0) + io.get("syscw", 0)
    chars = io.get("rchar", 0) + io.get("wchar", 0)
    big_calls = calls == 0 or chars // max(calls, 1) >= MIN_BYTES_PER_CALL
    read = max(
        io.get("read_bytes", 0), io.get("process_read_bytes", 0), io.get("rchar", 0) if big_calls else 0
    )
    written = max(
        io.get("write_bytes", 0), io.get("process_write_bytes", 0), io.get("wchar", 0) if big_calls else 0
    )
    return read, written


def io_progress(io: Mapping[str, int], kernel: Mapping[str, int]) -> bool:
    """Whether a rank's I/O shows it getting somewhere: enough bytes moved, or it spent most of
    the window waiting on a file in the kernel (a write to a slow file system, an fsync)."""
    read, written = io_bytes(io)
    return read + written >= IO_MIN_BYTES or kernel.get("file", 0) >= FILE_WAIT_PCT


def _rate(n: int, window_s: float) -> str:
    return f"{fmt_bytes(n)} in {window_s:.1f} s" + (f", {fmt_bytes(n / window_s)}/s" if window_s > 0 else "")


def io_phrase(io: Mapping[str, int], kernel: Mapping[str, int], window_s: float) -> str | None:
    """``writing: 5.0 MiB in 1.2 s, 4.2 MiB/s``, or ``in a file read or write 80% of the window``;
    None when its I/O is not progress."""
    read, written = io_bytes(io)
    parts = [
        f"{verb}: {_rate(n, window_s)}"
        for verb, n in (("writing", written), ("reading", read))
        if n >= IO_MIN_BYTES
    ]
    if not parts and kernel.get("file", 0) >= FILE_WAIT_PCT:
        parts.append(f"{KERNEL_WORDS['file']} {kernel['file']}% of the window")
    return ", ".join(parts) or None


def kernel_phrase(kernel: Mapping[str, int]) -> str | None:
    """``sleeping in a timer 70%, running 20%``: the two kernel states seen most."""
    top = [f"{KERNEL_WORDS.get(k, k)} {pct}%" for k, pct in list(kernel.items())[:2] if pct]
    return ", ".join(top) or None


def own_reprs(frames: Sequence[Frame]) -> dict[str, str]:
    """``file:function:name`` -> repr for the locals of a look's own frames (not torch's nor the
    standard library's): kept in memory to tell whether they moved and what a loop waits on."""
    out: dict[str, str] = {}
    for frame in frames:
        if frame.native or not frame.locals or is_internal_frame(frame):
            continue
        for local in frame.locals:
            if local.repr is None:
                continue
            out.setdefault(counter_key(frame, local.name), local.repr[:MAX_REPR])
            if len(out) >= MAX_REPRS:
                return out
    return out


def locals_moved(reprs: Sequence[Mapping[str, str]]) -> list[str]:
    """The names of the own frames' locals whose value changed between the first and the last look."""
    seen = [r for r in reprs if r]
    if len(seen) < 2:
        return []
    first, last = seen[0], seen[-1]
    return sorted({k.rsplit(":", 1)[-1] for k in first if k in last and first[k] != last[k]})


def frame_values(reprs: Mapping[str, str], file: str, function: str) -> dict[str, str]:
    """The locals of one function (``name -> repr``) in one look's reprs."""
    head = f"{os.path.basename(file)}:{function}:"
    return {k[len(head) :]: v for k, v in reprs.items() if k.startswith(head)}


QUEUED_NOTE_PCT = 50
"""A rank that queued for a core this much of the window is said to: its slowness is the host's."""


def queued_words(r: RankMotion) -> str:
    """``, queued for a core 95%`` where its run-queue wait was most of the window (a rank that
    computes slowly on an oversubscribed host); empty otherwise."""
    if r.queued_pct is None or r.queued_pct < QUEUED_NOTE_PCT:
        return ""
    return f", queued for a core {r.queued_pct}%"


__all__ = [
    "IO_MIN_BYTES",
    "KERNEL_WORDS",
    "QUEUED_NOTE_PCT",
    "frame_values",
    "io_bytes",
    "io_moved",
    "io_phrase",
    "io_progress",
    "kernel_kind",
    "kernel_phrase",
    "kernel_shares",
    "locals_moved",
    "own_reprs",
    "queued_words",
]
