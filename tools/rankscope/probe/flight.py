"""``enable_flight_recorder``: one line in training code, a dump on demand from a hung rank.

A rank that hangs is stuck inside C++ (a gloo or NCCL wait) and never returns
to the interpreter, so a Python signal handler on its main thread never runs.
The dump is therefore taken by a daemon thread: Python's C-level signal handler
writes the signal number into the fd registered with ``signal.set_wakeup_fd``
*immediately*, from whatever thread the kernel picked, and the daemon thread,
blocked reading that pipe, wakes up and writes this rank's flight-recorder
trace (``torch._C._distributed_c10d._dump_fr_trace``, which works for gloo as
well as NCCL) and the Python stacks of every thread (``faulthandler``). The
collective wait releases the GIL, so the daemon thread can run.

Files written to ``dump_dir`` (the ``TORCH_FR_DUMP_TEMP_FILE`` ``<prefix><rank>``
naming, so ``rankscope fr DIR`` and torchfrtrace both read them):

* ``fr_trace_rank_<R>``: the flight-recorder trace (pickle, as NCCL writes it);
* ``stacks_rank_<R>.txt``: every thread's Python stack;
* ``.rankscope-dumping-<R>``: there only while the rank writes the two above;
* ``.rankscope-probe-<PID>.json``: which signal asks this process for a dump. The process
  keeps it open, so ``rankscope stacks`` finds it in ``/proc/PID/fd`` (environment variables
  set from Python are not visible there), checks in ``/proc/PID/status`` that the signal is
  caught, and asks the hung rank for a dump while it analyses the stacks.

The recorder's buffer size is read once, when the first process group creates
the recorder, so call this **before** ``init_process_group``. For NCCL jobs the
same is available without code: ``TORCH_FR_BUFFER_SIZE=2000`` (older name
``TORCH_NCCL_TRACE_BUFFER_SIZE``), ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and
``TORCH_FR_DUMP_TEMP_FILE=/dir/fr_trace_rank_``; this function sets those too
(unless already set), so an NCCL watchdog timeout writes into the same place.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType, TracebackType

from rankscope.errors import InvalidInput, TorchMissing

log = logging.getLogger("rankscope.probe")

TRACE_PREFIX = "fr_trace_rank_"
STACKS_PREFIX = "stacks_rank_"
MARKER_PREFIX = ".rankscope-probe-"
"""The file a probed process holds open so that rankscope can find its dump folder and signal."""
BUSY_PREFIX = ".rankscope-dumping-"
"""``<BUSY_PREFIX><rank>`` is in the dump folder while the rank writes its dump: torch 2.13's first
recorder dump in a process imports torch._inductor (seconds on a busy host), and a reader that
asked for a dump waits longer for a rank that is writing one than for a rank that never answered."""

_state: dict[str, object] = {}
_lock = threading.Lock()


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def _write_atomic(path: Path, data: bytes) -> None:
    """Write then rename, so a reader never sees half a dump."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def dump_now(dump_dir: str | os.PathLike[str], reason: str = "request") -> list[str]:
    """Write this rank's flight-recorder trace and all threads' stacks; return the paths.

    Safe to call from any thread. Never raises: a probe must not take the job down.
    """
    out = Path(dump_dir)
    with _lock:
        rank = _rank()
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("rankscope: cannot create %s: %s", out, exc)
            return []
        busy = out / f"{BUSY_PREFIX}{rank}"
        with contextlib.suppress(OSError):
            busy.write_bytes(b"")
        try:
            return _dump_files(out, rank, reason)
        finally:
            with contextlib.suppress(OSError):
                busy.unlink()


def _dump_files(out: Path, rank: int, reason: str) -> list[str]:
    """The trace, then the stacks, each on its own: one that fails still leaves the other."""
    written: list[str] = []
    try:
        import torch._C._distributed_c10d as c10d

        trace = c10d._dump_fr_trace()  # type: ignore[attr-defined]
        path = out / f"{TRACE_PREFIX}{rank}"
        _write_atomic(path, bytes(trace))
        written.append(str(path))
    except Exception as exc:  # a failed dump must never kill the rank
        log.warning("rankscope: flight-recorder dump failed: %s", exc)
    try:
        path = out / f"{STACKS_PREFIX}{rank}.txt"
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "w") as fh:
            fh.write(f"# rankscope stacks of rank {rank} (pid {os.getpid()}), reason: {reason}\n")
            fh.flush()
            faulthandler.dump_traceback(fh, all_threads=True)
        os.replace(tmp, path)
        written.append(str(path))
    except Exception as exc:
        log.warning("rankscope: stack dump failed: %s", exc)
    return written


def _noop(signum: int, frame: FrameType | None) -> None:
    """Installed so the signal does not kill the process; the work happens in the dump thread."""


def _watch(read_fd: int, signum: int, dump_dir: str) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if signum in data:
            dump_now(dump_dir, reason=f"signal {signal.Signals(signum).name}")


def _chain_excepthook(dump_dir: str) -> None:
    previous = sys.excepthook

    def hook(tp: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        # A gloo collective timeout or a size mismatch surfaces as an exception: keep the evidence.
        dump_now(dump_dir, reason=f"uncaught {tp.__name__}")
        previous(tp, value, tb)

    sys.excepthook = hook


def _advertise(dump_dir: str, signum: int) -> None:
    """Write the marker and keep it open for the life of the process; removed at exit."""
    marker = Path(dump_dir) / f"{MARKER_PREFIX}{os.getpid()}.json"
    try:
        _write_atomic(
            marker,
            json.dumps({"signal": signum, "pid": os.getpid(), "trace_prefix": TRACE_PREFIX}).encode(),
        )
        _state["marker"] = open(marker, "rb")  # held open on purpose: see the module docstring
    except OSError as exc:
        log.warning("rankscope: cannot write %s: %s", marker, exc)
        return
    atexit.register(_unadvertise, marker)


def _unadvertise(marker: Path) -> None:
    with contextlib.suppress(OSError):
        marker.unlink()


def enable_flight_recorder(dump_dir: str, *, buffer_size: int = 2000, signum: int = signal.SIGUSR1) -> None:
    """Record collectives and dump them (plus all stacks) to ``dump_dir`` on ``signum``.

    Call from the main thread, before ``init_process_group``: the recorder's
    buffer size is fixed when the first process group is created. Idempotent.
    Then ``kill -USR1 <rank pid>`` (or ``rankscope`` itself) makes every rank
    write ``dump_dir/fr_trace_rank_<R>`` even while it is stuck in a collective,
    and an uncaught exception (a gloo timeout) writes the same files before the
    rank dies.
    """
    if buffer_size <= 0:
        raise InvalidInput(f"buffer_size must be positive, got {buffer_size}", "Pass e.g. buffer_size=2000.")
    if threading.current_thread() is not threading.main_thread():
        raise InvalidInput(
            "enable_flight_recorder must be called from the main thread (signal handlers live there).",
            "Call it at the top of your training script, before init_process_group.",
        )
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise TorchMissing("enable_flight_recorder needs torch in the training process.") from exc
    if _state.get("dump_dir"):
        return
    dump_path = os.path.abspath(dump_dir)
    os.makedirs(dump_path, exist_ok=True)

    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(buffer_size))
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(dump_path, TRACE_PREFIX))
    if dist.is_available() and dist.is_initialized():
        log.warning(
            "rankscope: enable_flight_recorder called after init_process_group; if TORCH_FR_BUFFER_SIZE "
            "was not set before, the recorder keeps 0 entries. Call it before init_process_group."
        )

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous_fd != -1:
        # Someone (asyncio) owns the wakeup fd: give it back and fall back to a handler that
        # only fires when the main thread is in Python.
        signal.set_wakeup_fd(previous_fd)
        os.close(read_fd)
        os.close(write_fd)
        log.warning(
            "rankscope: signal wakeup fd already in use; dumps of a rank stuck in C++ are not possible"
        )
        signal.signal(signum, lambda s, f: dump_now(dump_path, reason="signal"))
    else:
        previous_handler = signal.getsignal(signum)
        if previous_handler in (signal.SIG_DFL, signal.SIG_IGN, None):
            signal.signal(signum, _noop)
        thread = threading.Thread(
            target=_watch, args=(read_fd, int(signum), dump_path), name="rankscope-flight-dump", daemon=True
        )
        thread.start()
        _state["thread"] = thread
    _chain_excepthook(dump_path)
    _advertise(dump_path, int(signum))
    _state["dump_dir"] = dump_path
    with contextlib.suppress(Exception):
        log.info("rankscope: flight recorder on, dumps to %s on %s", dump_path, signal.Signals(signum).name)
