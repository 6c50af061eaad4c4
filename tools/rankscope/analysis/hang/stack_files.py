"""Saved stacks, as incidents arrive once the job is gone: parsed into per-rank threads.

A cluster's hang detector saved ``py-spy dump`` output (JSON or text, with or without
``--native``/``--locals``) for every rank, or a log holds every rank's ``faulthandler``
traceback (``dump_traceback_later``, a fatal signal), each line under torchrun's
``[rankN]:`` / ``[defaultN]:`` prefix. These parsers turn that text into the same
:class:`ThreadStack` the live capture produces, so the same analysis and verdict apply.
Pure: the shell reads the files and hands over their text.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rankscope.models.core import Frame, LocalVar, ThreadStack

# -- which rank a file is for ------------------------------------------------------------------------

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)(?!\d)", re.IGNORECASE)
_TORCHRUN_LOG = re.compile(r"attempt_\d+/(\d+)/(?:stdout|stderr|error)\.(?:log|json)$")
_PREFIX = re.compile(r"^\[(?:rank|default|[A-Za-z_]+?)(\d+)\]:(.*)$")


def rank_from_name(path: str) -> int | None:
    """``rank3``, ``rank_3``, ``rank-3``, ``stacks_rank_3.txt``; torchrun's ``attempt_0/3/stderr.log``."""
    norm = path.replace("\\", "/")
    m = _TORCHRUN_LOG.search(norm)
    if m:
        return int(m.group(1))
    m = _RANK_IN_NAME.search(norm.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def split_by_prefix(text: str) -> dict[int, str]:
    """The lines of each rank of a torchrun log (``[rank3]:...`` / ``[default3]:...``); {} when none."""
    per: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = _PREFIX.match(line)
        if m:
            per.setdefault(int(m.group(1)), []).append(m.group(2))
    return {rank: "\n".join(lines) for rank, lines in per.items()}


# -- frames from short file names -----------------------------------------------------------------

_LIBRARIES = frozenset(
    {
        "torch",
        "transformers",
        "accelerate",
        "deepspeed",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "datasets",
        "numpy",
        "fsspec",
        "huggingface_hub",
        "safetensors",
        "triton",
        "apex",
        "torchvision",
        "torchaudio",
        "tqdm",
        "wandb",
        "torchtitan",
        "torchdata",
        "pandas",
        "filelock",
        "urllib3",
        "requests",
    }
)
_STDLIB_PREFIX = f"/usr/lib/python{sys.version_info.major}/"
_SITE_PREFIX = "/site-packages/"


def full_path(short: str) -> str:
    """py-spy text shows paths relative to sys.path (``threading.py``, ``torch/nn/...``): put the
    stdlib and well-known libraries back under a prefix the frame rules recognise."""
    if not short or short.startswith(("/", "<")) or re.match(r"^[A-Za-z]:\\", short):
        return short
    top = short.replace("\\", "/").split("/", 1)[0]
    name = top[:-3] if top.endswith(".py") else top
    if name in sys.stdlib_module_names:
        return _STDLIB_PREFIX + short
    if name in _LIBRARIES:
        return _SITE_PREFIX + short
    return short


# -- py-spy JSON ------------------------------------------------------------------------------------


def pyspy_json(data: Any) -> list[tuple[int | None, list[dict[str, Any]]]]:
    """``py-spy dump --json`` output -> [(pid, raw threads)] (one process per dump)."""
    if not isinstance(data, list) or not all(isinstance(t, dict) and "frames" in t for t in data):
        raise ValueError("not py-spy JSON (a list of threads with 'frames')")
    pids = {t.get("pid") for t in data if isinstance(t.get("pid"), int)}
    pid = pids.pop() if len(pids) == 1 else None
    return [(pid, data)]


# -- py-spy text ------------------------------------------------------------------------------------

_PROCESS = re.compile(r"^Process (\d+):")
_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?::\s*"(.*)")?\s*$')
_PY_FRAME = re.compile(r"^\s{4}(\S.*?) \(([^()]*?):(\d+)\)\s*$")
_LOCAL = re.compile(r"^\s{12}([A-Za-z_]\w*): (.*)$")


@dataclass
class _Proc:
    pid: int | None
    threads: list[ThreadStack] = field(default_factory=list)


def _native_frame(line: str) -> Frame | None:
    body = line.strip()
    if not body.endswith(")") or " (" not in body:
        return None
    name, lib = body[:-1].rsplit(" (", 1)
    return Frame(function=name, file=lib, module=lib, native=True)


def _thread(match: re.Match[str], pid: int | None) -> ThreadStack:
    raw_id, status, name = match.group(1), match.group(2), match.group(3)
    tid = int(raw_id, 16) if raw_id.lower().startswith("0x") else int(raw_id)
    os_tid = None if raw_id.lower().startswith("0x") else tid
    is_main = name == "MainThread" or (pid is not None and os_tid == pid)
    return ThreadStack(
        thread_id=tid, os_thread_id=os_tid, name=name, active="active" in status, is_main=is_main
    )


def pyspy_text(text: str) -> list[tuple[int | None, list[ThreadStack]]]:
    """``py-spy dump`` text (several processes may follow each other) -> [(pid, threads)]."""
    procs: list[_Proc] = []
    thread: ThreadStack | None = None
    for line in text.splitlines():
        m = _PROCESS.match(line)
        if m:
            procs.append(_Proc(int(m.group(1))))
            thread = None
            continue
        m = _THREAD.match(line)
        if m:
            if not procs:
                procs.append(_Proc(None))
            thread = _thread(m, procs[-1].pid)
            procs[-1].threads.append(thread)
            continue
        if thread is None:
            continue
        _frame_line(thread, line)
    if not any(p.threads for p in procs):
        raise ValueError("not py-spy text output (no 'Thread N (state): \"name\"' line)")
    return [(p.pid, p.threads) for p in procs if p.threads]


def _frame_line(thread: ThreadStack, line: str) -> None:
    m = _PY_FRAME.match(line)
    if m:
        thread.frames.append(Frame(function=m.group(1), file=full_path(m.group(2)), line=int(m.group(3))))
        return
    m = _LOCAL.match(line)
    if m and thread.frames and not thread.frames[-1].native:
        last = thread.frames[-1]
        last.locals = [*(last.locals or []), LocalVar(name=m.group(1), repr=m.group(2))]
        return
    if line.startswith("    ") and not line.startswith("        "):
        frame = _native_frame(line)
        if frame is not None:
            thread.frames.append(frame)


# -- faulthandler -----------------------------------------------------------------------------------

_FH_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*?)\])? \(most recent call first\):\s*$|^Stack \(most recent call first\):\s*$"
)
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')


def faulthandler(text: str) -> list[ThreadStack]:
    """Python faulthandler output -> threads; a thread dumped again (repeat=True) starts a new dump,
    so the last dump is the one kept."""
    threads: list[ThreadStack] = []
    current: ThreadStack | None = None
    for line in text.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            tid = int(m.group(2), 16) if m.group(2) else 0
            if any(t.thread_id == tid for t in threads):
                threads = []
            current = ThreadStack(
                thread_id=tid,
                name=m.group(3) or ("current" if m.group(1) == "Current thread" else None),
                active=m.group(1) == "Current thread",
            )
            threads.append(current)
            continue
        f = _FH_FRAME.match(line)
        if f and current is not None:
            current.frames.append(Frame(function=f.group(3), file=f.group(1), line=int(f.group(2))))
        elif current is not None and line.strip() and not line.startswith(" "):
            current = None
    threads = [t for t in threads if t.frames]
    if not threads:
        raise ValueError("no faulthandler traceback ('Thread 0x... (most recent call first):')")
    _pick_main(threads)
    return threads


def _pick_main(threads: Iterable[ThreadStack]) -> None:
    """faulthandler does not name threads: the main thread is the one that runs ``<module>``."""
    ts = list(threads)
    main = next((t for t in ts if t.frames and t.frames[-1].function == "<module>"), None)
    main = main or next((t for t in ts if t.name == "MainThread"), None) or ts[0]
    main.is_main = True


# -- any of them ------------------------------------------------------------------------------------


def sniff(text: str) -> str:
    """``pyspy_json``, ``pyspy_text``, ``faulthandler`` or ``unknown``, from the text itself."""
    if text.lstrip()[:1] == "[":
        try:
            json.loads(text)
            return "pyspy_json"
        except ValueError:
            pass
    if "(most recent call first):" in text:
        return "faulthandler"
    if re.search(r'^(Process \d+:|Thread \S+ \([^)]*\):\s*")', text, re.MULTILINE):
        return "pyspy_text"
    return "unknown"


__all__ = [
    "faulthandler",
    "full_path",
    "pyspy_json",
    "pyspy_text",
    "rank_from_name",
    "sniff",
    "split_by_prefix",
]
