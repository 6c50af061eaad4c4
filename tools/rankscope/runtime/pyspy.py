"""The one py-spy runner: find the binary, check its version, dump one process.

Every call has a timeout; failures are classified into :class:`RankError` kinds with a
fix, from py-spy's real error texts (py-spy 0.4: "Failed to get process executable name.
Check that the process is running." caused by "Permission denied (os error 13)" or "No
such file or directory (os error 2)", "Failed to find python version from target
process", ...).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.analysis.code_origin import origin_of
from rankscope.errors import DumpFailed, PySpyNotFound
from rankscope.models.core import CodeRoots, Frame, LocalVar, ThreadStack
from rankscope.options import DumpOptions
from rankscope.runtime import procfs
from rankscope.runtime.procfs import is_alive

MIN_VERSION = (0, 3, 14)


def find_pyspy() -> str:
    """The py-spy executable: $RANKSCOPE_PYSPY, then PATH, then next to this interpreter."""
    override = os.environ.get("RANKSCOPE_PYSPY")
    if override:
        if os.access(override, os.X_OK):
            return override
        raise PySpyNotFound(f"RANKSCOPE_PYSPY={override} is not an executable file.")
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    if os.access(beside, os.X_OK):
        return str(beside)
    raise PySpyNotFound(
        "py-spy was not found (not in PATH, not next to the Python interpreter, RANKSCOPE_PYSPY unset)."
    )


@functools.lru_cache(maxsize=8)
def pyspy_version(exe: str) -> tuple[int, ...]:
    """The version of the py-spy at ``exe`` (``py-spy 0.4.3`` -> ``(0, 4, 3)``)."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PySpyNotFound(f"Cannot run {exe} --version: {exc}") from exc
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    if not m:
        raise PySpyNotFound(f"{exe} --version printed no version: {out.stdout.strip() or out.stderr.strip()}")
    return tuple(int(x) for x in m.groups())


def check_pyspy(exe: str | None = None) -> str:
    """Find py-spy and make sure it is recent enough for ``dump --json``.

    The py-spy installed beside this interpreter is rankscope's own dependency (pinned
    >= 0.3.14), so only a foreign one ($RANKSCOPE_PYSPY, another PATH entry) costs a
    ``--version`` run.
    """
    exe = exe or find_pyspy()
    beside = Path(sys.executable).parent / "py-spy"
    with contextlib.suppress(OSError):
        if beside.exists() and os.path.samefile(exe, beside) and not os.environ.get("RANKSCOPE_PYSPY"):
            return exe
    version = pyspy_version(exe)
    if version < MIN_VERSION:
        raise PySpyNotFound(
            f"py-spy {'.'.join(map(str, version))} at {exe} is too old (need >= 0.3.14 for `dump --json`).",
            fix="Upgrade it: `pip install -U py-spy`.",
        )
    return exe


def classify_error(stderr: str, pid: int, alive: bool) -> tuple[str, str]:
    """(kind, one-line message) for a failed ``py-spy dump``, from its stderr."""
    text = stderr.strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not re.match(r"^\d+:", ln.strip())]
    first = next((ln for ln in lines if ln.startswith("Error:")), lines[0] if lines else "py-spy failed")
    causes = " ".join(ln for ln in lines if re.match(r"^(\d+: )?[A-Z]", ln) and "Stack backtrace" not in ln)
    low = text.lower()
    if (
        "permission denied" in low
        or "operation not permitted" in low
        or "os error 13" in low
        or "os error 1)" in low
    ):
        return "permission_denied", f"py-spy could not attach to pid {pid}: permission denied ({first})"
    if not alive or "no such process" in low or "os error 3)" in low or "no such file or directory" in low:
        return "process_exited", f"pid {pid} exited during capture ({first})"
    if "failed to find python version" in low or "python interpreter" in low or "unsupported" in low:
        return "unsupported", f"pid {pid} is not a Python process py-spy can read ({first})"
    return "failed", f"py-spy failed on pid {pid}: {first} {causes}".strip()


def parse_dump(data: list[dict[str, Any]], pid: int, roots: CodeRoots | None = None) -> list[ThreadStack]:
    """py-spy ``dump --json`` output -> ThreadStacks (main thread flagged); ``roots``: the rank's
    (:func:`rankscope.runtime.procfs.code_roots`), which tell each frame's origin."""
    threads: list[ThreadStack] = []
    for raw in data:
        frames: list[Frame] = []
        for f in raw.get("frames") or ():
            locals_raw = f.get("locals")
            is_native = f.get("module") is not None or (
                f.get("line") == 0 and f.get("filename", "").endswith((".so", ".0"))
            )
            file = str(f.get("filename", ""))
            frames.append(
                Frame(
                    function=str(f.get("name", "?")),
                    file=file,
                    origin="native" if is_native else origin_of(file, roots),
                    line=f.get("line") if not is_native else None,
                    module=f.get("module"),
                    native=bool(is_native),
                    locals=[
                        LocalVar(name=str(v.get("name")), repr=v.get("repr"), arg=bool(v.get("arg")))
                        for v in locals_raw
                    ]
                    if locals_raw
                    else None,
                )
            )
        os_tid = raw.get("os_thread_id")
        threads.append(
            ThreadStack(
                thread_id=int(raw.get("thread_id") or 0),
                os_thread_id=os_tid,
                name=raw.get("thread_name"),
                active=raw.get("active"),
                owns_gil=raw.get("owns_gil"),
                is_main=os_tid == pid if os_tid is not None else raw.get("thread_name") == "MainThread",
                frames=frames,
            )
        )
    if threads and not any(t.is_main for t in threads):
        named = next((t for t in threads if t.name == "MainThread"), None)
        if named is not None:
            named.is_main = True
    return threads


DUMP_FLAGS: dict[str, str] = {"native": "--native", "locals": "--locals", "nonblocking": "--nonblocking"}
"""The :class:`DumpOptions` fields that are ``py-spy dump`` flags, each set when the field is.
The other fields are the capture's: ``timeout`` bounds :func:`finish_dump`, the rest decide
what else a capture reads."""


def dump_argv(pid: int, options: DumpOptions, exe: str) -> list[str]:
    """The ``py-spy dump --json`` command line for one pid."""
    argv = [exe, "dump", "--json", "--pid", str(pid)]
    return argv + [flag for name, flag in DUMP_FLAGS.items() if getattr(options, name)]


@dataclass
class StartedDump:
    """One started ``py-spy dump``: its process, what it has printed so far, and its deadline.

    Its output is read as it comes (:func:`wait_first`), so a large ``--native`` JSON never fills
    the pipe and stalls py-spy while another dump is being waited for.
    """

    proc: subprocess.Popen[bytes]
    pid: int
    timeout: float
    deadline: float
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    open: set[int] = field(default_factory=set)
    """The pipe fds not yet at end of file: empty once py-spy has printed everything."""

    @property
    def printed(self) -> bool:
        return not self.open


def start_dump(pid: int, options: DumpOptions, exe: str | None = None) -> StartedDump:
    """Start ``py-spy dump --json`` on one pid without waiting; :func:`finish_dump` collects it.

    Starting every rank's dump first and collecting each as it ends (:func:`wait_first`) runs
    them side by side without a thread per rank. ``options.timeout`` counts from now.
    """
    argv = dump_argv(pid, options, exe or find_pyspy())
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except FileNotFoundError as exc:
        raise DumpFailed("pyspy_missing", f"py-spy vanished: {exc}") from exc
    except OSError as exc:
        raise DumpFailed("failed", f"cannot run py-spy: {exc}") from exc
    pipes = {p.fileno() for p in (proc.stdout, proc.stderr) if p is not None}
    return StartedDump(proc, pid, options.timeout, time.monotonic() + options.timeout, open=pipes)


READ_CHUNK = 1 << 16


def _read_ready(dumps: list[StartedDump], wait: float) -> None:
    """Read whatever the dumps' pipes hold, waiting up to ``wait`` seconds for any to have some."""
    with selectors.DefaultSelector() as sel:
        for d in dumps:
            for fd in d.open:
                sel.register(fd, selectors.EVENT_READ, d)
        for key, _ in sel.select(max(wait, 0.0)):
            d = key.data
            chunk = os.read(key.fd, READ_CHUNK)
            if not chunk:
                d.open.discard(key.fd)
            elif d.proc.stdout is not None and key.fd == d.proc.stdout.fileno():
                d.out += chunk
            else:
                d.err += chunk


def wait_first(dumps: list[StartedDump]) -> StartedDump:
    """The first of ``dumps`` (started, not yet finished) to have printed everything or to pass
    its deadline; the others' output is read meanwhile. Hand it to :func:`finish_dump`."""
    if not dumps:
        raise ValueError("no started dump to wait for")
    while True:
        now = time.monotonic()
        ready = next((d for d in dumps if d.printed or d.deadline <= now), None)
        if ready is not None:
            return ready
        _read_ready(dumps, min(d.deadline for d in dumps) - now)


def _close(d: StartedDump) -> None:
    for pipe in (d.proc.stdout, d.proc.stderr):
        if pipe is not None:
            pipe.close()


def finish_dump(d: StartedDump) -> list[dict[str, Any]]:
    """Collect a started dump: its parsed JSON, or raise DumpFailed.

    Dumps started together are collected in the order they end (:func:`wait_first`), each within
    its own deadline. Past it py-spy is killed and reaped (it has no children), so nothing is
    left behind.
    """
    while not d.printed and time.monotonic() < d.deadline:
        _read_ready([d], d.deadline - time.monotonic())
    if not d.printed:
        abandon(d)
        raise DumpFailed("timeout", f"py-spy did not finish on pid {d.pid} within {d.timeout:g}s")
    try:  # both pipes closed: py-spy is exiting
        d.proc.wait(timeout=max(d.deadline - time.monotonic(), ABANDON_WAIT))
    except subprocess.TimeoutExpired as exc:
        abandon(d)
        raise DumpFailed("timeout", f"py-spy did not exit on pid {d.pid} within {d.timeout:g}s") from exc
    _close(d)
    stdout, stderr = d.out.decode(errors="replace"), d.err.decode(errors="replace")
    if d.proc.returncode != 0:
        kind, message = classify_error(stderr, d.pid, is_alive(d.pid))
        raise DumpFailed(kind, message)
    try:
        data = json.loads(d.out)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DumpFailed("failed", f"py-spy printed no JSON for pid {d.pid}: {stdout[:200]!r}") from exc
    if not isinstance(data, list):
        raise DumpFailed("failed", f"unexpected py-spy JSON for pid {d.pid}")
    return data


ABANDON_WAIT = 5.0
"""Seconds to wait for a killed py-spy to be reaped (it exits at once; the bound is for a stuck kernel)."""


def abandon(d: StartedDump) -> None:
    """Kill and reap a started dump that will not be collected (past its deadline, or the capture
    was cut short, e.g. by Ctrl-C), so no py-spy is left attached to a rank. py-spy starts no
    children: killing it is reaping its whole tree."""
    if d.proc.poll() is None:
        d.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.proc.wait(timeout=ABANDON_WAIT)
    _close(d)


def dump_raw(pid: int, options: DumpOptions, exe: str | None = None) -> list[dict[str, Any]]:
    """Run ``py-spy dump --json`` on one pid within ``options.timeout``; its parsed JSON, or raise DumpFailed."""
    return finish_dump(start_dump(pid, options, exe))


def dump(pid: int, options: DumpOptions, exe: str | None = None) -> list[ThreadStack]:
    """All threads of ``pid`` as ThreadStacks (locals not yet redacted: the caller redacts), each
    frame's origin told by the roots ``pid`` imports from."""
    return parse_dump(dump_raw(pid, options, exe), pid, procfs.code_roots(pid))


def record_argv(pid: int, exe: str, output: str, *, rate: int) -> list[str]:
    """``py-spy record`` of one pid into ``output`` as raw collapsed stacks, one line per thread and
    stack, without pausing the process (``--nonblocking``), idle threads included (a rank blocked
    in a collective is idle, and its waiting is what is measured), until it is interrupted."""
    return [
        exe,
        "record",
        "--pid",
        str(pid),
        "--format",
        "raw",
        "--output",
        output,
        "--threads",
        "--idle",
        "--nonblocking",
        "--full-filenames",
        "--rate",
        str(rate),
    ]


def start_record(pid: int, output: str, *, rate: int, exe: str) -> subprocess.Popen[bytes]:
    """Start sampling one pid in the background; :func:`stop_record` ends it and reads what it saw."""
    try:
        return subprocess.Popen(
            record_argv(pid, exe, output, rate=rate),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        raise DumpFailed("failed", f"cannot run py-spy record: {exc}") from exc


def stop_record(proc: subprocess.Popen[bytes], output: str, timeout: float = 5.0) -> str:
    """Interrupt a started ``py-spy record`` (it writes its file on SIGINT), reap it within
    ``timeout`` seconds (killed past that) and return the file's text; '' when it wrote none."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
    try:
        return Path(output).read_text(errors="replace")
    except OSError:
        return ""
    finally:
        with contextlib.suppress(OSError):
            os.unlink(output)


__all__ = [
    "DUMP_FLAGS",
    "DumpFailed",
    "StartedDump",
    "abandon",
    "check_pyspy",
    "classify_error",
    "dump",
    "dump_argv",
    "dump_raw",
    "find_pyspy",
    "finish_dump",
    "parse_dump",
    "record_argv",
    "start_dump",
    "start_record",
    "stop_record",
    "wait_first",
]
