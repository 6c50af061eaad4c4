"""Launch a script under real torchrun and watch it: stream, detect a hang, reap.

How output is collected: torchrun runs with ``--redirects 3 --log_dir DIR``,
so every worker writes its stdout and stderr to its own files
(``DIR/<run_id>/attempt_0/<local_rank>/{stdout,stderr}.log``) and nothing
interleaves. rankscope tails those files itself and prints each line with a
``[rankN]:`` prefix as it arrives. This works for any script (nothing is
injected into the ranks), keeps stdout and stderr apart per rank, and does not
depend on torchrun's own tee prefixes, which have changed between releases.
torchrun's own output (its warnings and the ChildFailedError summary) goes to
a file rankscope tails too.

How a hang is detected: by the one stall detector `rankscope watch` uses too
(:class:`rankscope.analysis.hang.stall.StallDetector`), fed every ``POLL_INTERVAL`` with cheap
samples of every process under torchrun (/proc: CPU time, state, kernel wait, I/O) and the lines
the ranks printed. The job makes no progress when no rank printed a line or moved I/O (a slow
checkpoint write is progress) for ``hang_timeout`` seconds *and* the ranks are idle (CPU time
grew by less than 5% of a core, and no process was seen running or waiting for a core in more
than 20% of the samples: on a loaded host a starved rank still importing torch gets little CPU
but is not idle). Ranks blocked in a gloo collective sleep in the kernel, so they are idle. NCCL
busy-polls, so a hung GPU rank burns a full core: a job quiet for max(5 × ``hang_timeout``,
300 s) is declared hung however busy it is. Then rankscope captures stacks and the verdict
through ``rankscope.api.dump_stacks(pid=<torchrun pid>)`` and reaps the tree.

torchrun starts each worker in its own session, so rankscope reaps by process
tree (``rankscope.runtime.proctree.reap_tree``) and sweeps any process of the tree
that outlived it (``proctree.kill_survivors``: identified by pid *and* start time, never by name).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TextIO

from rankscope.analysis.collapse import collapse_rank_lines
from rankscope.analysis.hang.stall import JobSample, RankSample, StallDetector
from rankscope.analysis.redact import Redactor
from rankscope.analysis.runs import bound_run_report, parse_failures, run_next_steps, run_summary
from rankscope.capabilities.watch_sampler import read_rank
from rankscope.errors import InvalidInput, RankscopeError, TorchMissing
from rankscope.models.core import StacksReport
from rankscope.models.run import RankOutput, RunOutcome, RunReport
from rankscope.options import DumpOptions
from rankscope.runtime import net, procfs, subproc
from rankscope.runtime.proctree import ParentLinks, descendants, kill_survivors, reap_tree

log = logging.getLogger("rankscope.capabilities.launch")

POLL_INTERVAL = 0.2
"""Seconds between two looks at the output files and the ranks' CPU time."""
BUSY_QUIET_FACTOR = 5.0
BUSY_QUIET_MIN = 300.0
"""Silent max(BUSY_QUIET_FACTOR × hang timeout, BUSY_QUIET_MIN) seconds, a job is hung even when its ranks
burn CPU (NCCL busy-polls); the floor keeps a slow start (imports on a loaded host) from counting."""
MAX_LINES_PER_STREAM = 5000
"""Lines kept per rank and stream; older ones are dropped (and counted)."""
MAX_LINE_CHARS = 4000
LAUNCHER_TAIL_LINES = 200
STACKS_TIMEOUT = 20.0
REAP_GRACE = 5.0
PORT_RETRIES = 2

BACKEND_ENV = "RANKSCOPE_BACKEND"
"""Set in every rank by ``run_all_ranks`` (and ``run_job``): ``gloo`` when this host has no NVIDIA GPU, else
``nccl``. Scripts pick their backend with
``os.environ.get("RANKSCOPE_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")``."""

_OWN_PREFIX = re.compile(r"^\[rank(\d+)\]:\s?")


class Interrupted(KeyboardInterrupt):
    """rankscope itself got SIGTERM while watching a job (treated like Ctrl-C)."""


# --------------------------------------------------------------------------- output files


@dataclass
class _Tail:
    """Follows one growing file, yielding complete lines (the last partial line waits)."""

    path: Path | None = None
    offset: int = 0
    partial: bytes = b""

    def read(self, final: bool = False) -> list[str]:
        if self.path is None:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        parts = data.split(b"\n")
        self.partial = parts.pop()
        if final and self.partial:
            parts.append(self.partial)
            self.partial = b""
        return [_clean(p) for p in parts]


def _clean(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if "\r" in text:  # progress bars redraw with \r: keep what the terminal would show last
        text = text.rsplit("\r", 1)[-1]
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + f"… [{len(text) - MAX_LINE_CHARS} chars cut]"
    return text


@dataclass
class _RankLog:
    rank: int
    stdout: _Tail = field(default_factory=_Tail)
    stderr: _Tail = field(default_factory=_Tail)
    out_lines: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_LINES_PER_STREAM))
    err_lines: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_LINES_PER_STREAM))
    dropped: int = 0
    pid: int | None = None

    def add(self, which: str, line: str) -> None:
        lines = self.out_lines if which == "stdout" else self.err_lines
        if len(lines) == lines.maxlen:
            self.dropped += 1
        lines.append(line)


def _strip_own_prefix(rank: int, line: str) -> str:
    """torch prefixes uncaught tracebacks with ``[rankN]:``; drop it so ranks' lines compare equal."""
    m = _OWN_PREFIX.match(line)
    return line[m.end() :] if m and int(m.group(1)) == rank else line


# --------------------------------------------------------------------------- /proc sampling


def _sample_proc(pid: int) -> tuple[int, int, str] | None:
    """(CPU ticks, start time, state of the main thread) of a live process, from /proc/PID/stat."""
    f = procfs.stat_fields(pid)
    if f is None or f[0] in ("Z", "X"):
        return None
    try:
        return int(f[11]) + int(f[12]), int(f[19]), f[0]
    except (IndexError, ValueError):
        return None


def _env_rank(pid: int) -> int | None:
    rank = (procfs.read_environ(pid) or {}).get("RANK")
    if rank is not None:
        with contextlib.suppress(ValueError):
            return int(rank)
    return None


@dataclass
class _Watch:
    """Cheap samples of every process under the launcher, fed to the one stall detector
    (:class:`rankscope.analysis.hang.stall.StallDetector`, which `rankscope watch` uses too)."""

    root: int
    detector: StallDetector | None = None  # None: hang detection off
    seen: dict[int, int] = field(default_factory=dict)  # pid -> start time: for the final sweep
    rank_pids: dict[int, int] = field(default_factory=dict)  # rank -> pid
    links: ParentLinks = field(default_factory=ParentLinks)  # parents kept between samples

    def sample(self, now: float, output: int) -> None:
        """Every process under the launcher read once; ``output``: the lines the ranks printed so far.
        The host's other processes are not read again at each sample (``links``): a run sits beside
        other jobs, and reading every process's stat file five times a second is most of its cost."""
        kids = self.links.children()
        ranks: dict[int, RankSample] = {}
        for pid in descendants(self.root, kids):
            got = read_rank(pid)
            if got is None:
                continue
            ranks[pid] = got
            if pid not in self.seen:
                first = _sample_proc(pid)
                self.seen[pid] = first[1] if first is not None else 0
                if pid in kids.get(self.root, []):
                    rank = _env_rank(pid)
                    if rank is not None:
                        self.rank_pids[rank] = pid
        if self.detector is not None:
            self.detector.add(JobSample(t=now, ranks=ranks, output=output))


# --------------------------------------------------------------------------- the run


def _has_nvidia_gpu() -> bool:
    """Cheap GPU presence check that does not import torch in rankscope's own process."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))


def _job_env(env: dict[str, str] | None) -> dict[str, str]:
    full = dict(os.environ)
    full.update(env or {})
    full["PYTHONUNBUFFERED"] = "1"
    full.setdefault("OMP_NUM_THREADS", "1")
    # Single node on loopback: gloo otherwise resolves the hostname, which in containers
    # often names an interface the ranks cannot reach.
    full.setdefault("GLOO_SOCKET_IFNAME", "lo")
    full.setdefault(BACKEND_ENV, "nccl" if _has_nvidia_gpu() else "gloo")
    for leftover in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        full.pop(leftover, None)  # set by torchrun; stale values from an outer job would confuse it
    return full


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While watching, SIGTERM to rankscope behaves like Ctrl-C (so the job gets reaped)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"received signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """Let a second Ctrl-C (or SIGTERM) not cut the reaping short: it is bounded, orphans are not."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _capture_stacks(pid: int, timeout: float) -> tuple[StacksReport | None, str | None]:
    """Stacks and verdict of the hung job, or why they could not be taken (never raises)."""
    from rankscope.capabilities.stacks import (
        dump_stacks,  # lazily: the stacks shell is needed only for a hang
    )

    try:
        return dump_stacks(pid, DumpOptions(timeout=timeout)), None
    except RankscopeError as exc:
        return None, f"stack capture failed: {exc.render()}"
    except Exception as exc:  # the job must still be reaped and the rest reported
        log.warning("stack capture failed", exc_info=True)
        return None, f"stack capture failed: {type(exc).__name__}: {exc}"


@dataclass
class _Runner:
    """One launch: torchrun started, its outputs tailed, its ranks watched, then reaped."""

    argv: list[str]
    log_dir: Path
    env: dict[str, str]
    cwd: str | None
    nproc: int
    stream: TextIO | None
    redactor: Redactor
    ranks: dict[int, _RankLog] = field(default_factory=dict)
    launcher: _Tail = field(default_factory=_Tail)
    launcher_lines: deque[str] = field(default_factory=lambda: deque(maxlen=LAUNCHER_TAIL_LINES))
    last_output: float = 0.0
    lines: int = 0  # lines the ranks printed so far: the detector's output signal
    mute_launcher: bool = False  # set while rankscope stops the job: torchrun's shutdown trace is noise

    def __post_init__(self) -> None:
        self.ranks = {r: _RankLog(rank=r) for r in range(self.nproc)}

    def _find_files(self) -> None:
        for rank, rl in self.ranks.items():
            for which in ("stdout", "stderr"):
                tail: _Tail = getattr(rl, which)
                if tail.path is None:
                    found = sorted(self.log_dir.glob(f"*/attempt_*/{rank}/{which}.log"))
                    if found:
                        tail.path = found[-1]

    def pump(self, now: float, final: bool = False) -> None:
        """Read what was written since the last look, store it and stream it."""
        self._find_files()
        wrote = False
        for rank, rl in self.ranks.items():
            for which in ("stdout", "stderr"):
                for raw in getattr(rl, which).read(final):
                    line = self.redactor.text(_strip_own_prefix(rank, raw))
                    rl.add(which, line)
                    self.last_output = now
                    self.lines += 1
                    if self.stream is not None:
                        self.stream.write(f"[rank{rank}]: {line}\n")
                        wrote = True
        for raw in self.launcher.read(final):
            line = self.redactor.text(raw)
            self.launcher_lines.append(line)
            if self.stream is not None and not self.mute_launcher:
                self.stream.write(f"[torchrun]: {line}\n")
                wrote = True
        if wrote and self.stream is not None:
            with contextlib.suppress(OSError, ValueError):
                self.stream.flush()


MAX_NPROC = 64
"""The most ranks a run starts on this one host."""


def _validate(
    script: str, nproc: int, hang_timeout: float | None, timeout: float | None, cwd: str | None
) -> Path:
    """The script to run, after the checks both faces share (``rankscope run``, ``run_all_ranks``)."""
    if not script.strip():
        raise InvalidInput("script is empty.", fix="Pass the path of a Python script, e.g. /tmp/probe.py.")
    if not 1 <= nproc <= MAX_NPROC:
        raise InvalidInput(
            f"nproc (--nproc) must be between 1 and {MAX_NPROC}, got {nproc}.",
            fix="Pass the number of ranks to start, e.g. 2.",
        )
    if hang_timeout is not None and hang_timeout <= 0:
        raise InvalidInput(
            f"hang_timeout (--hang-timeout) must be positive seconds, got {hang_timeout:g}.",
            fix="Pass the seconds of silence that count as a hang, e.g. 30 (CLI: --hang-timeout 0 turns it off).",
        )
    if timeout is not None and timeout <= 0:
        raise InvalidInput(
            f"timeout (--timeout) must be positive seconds, got {timeout:g}.",
            fix="Pass the seconds the whole run may take, e.g. 120.",
        )
    path = Path(script)
    if not path.is_absolute():
        path = Path(cwd or os.getcwd()) / path
    if not path.is_file():
        raise InvalidInput(
            f"script {script!r} is not a file (looked at {path}).",
            fix="Pass the path of the training script, absolute or relative to the working directory: "
            "`rankscope run --nproc N -- path/to/train.py ARGS`.",
        )
    if cwd is not None and not Path(cwd).is_dir():
        raise InvalidInput(
            f"working directory {cwd!r} does not exist.", fix="Pass an existing directory as cwd."
        )
    return path.resolve()


def run_job(
    script: str,
    args: list[str] | None = None,
    *,
    nproc: int = 2,
    hang_timeout: float | None = 60.0,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    stream: TextIO | None = None,
    python: str | None = None,
) -> RunReport:
    """Run ``script`` on ``nproc`` ranks under torchrun on this host and report how it ended.

    Streams every rank's output (``[rankN]: line``) to ``stream`` as it
    arrives. A job silent and idle for ``hang_timeout`` seconds (None: never)
    gets its stacks and verdict captured, then is terminated; a job still
    running after ``timeout`` seconds (None: no limit) is terminated. On Ctrl-C
    or SIGTERM the whole tree is reaped and ``KeyboardInterrupt`` propagates
    (the CLI exits 130). Nothing the job started is left behind.

    ``env`` adds variables for the ranks on top of this process's environment;
    ``cwd`` is the ranks' working directory (a relative ``script`` is resolved
    against it); ``python`` is the interpreter that runs torchrun (default:
    this one). ``RANK``/``WORLD_SIZE``/``MASTER_PORT`` left over from an outer
    job are removed; ``OMP_NUM_THREADS=1`` and ``GLOO_SOCKET_IFNAME=lo`` are
    set unless given.
    """
    path = _validate(script, nproc, hang_timeout, timeout, cwd)
    exe = python or sys.executable
    if python is not None and shutil.which(python) is None and not Path(python).is_file():
        raise InvalidInput(
            f"python interpreter {python!r} not found.",
            fix="Pass the interpreter of the training environment.",
        )
    full_env = _job_env(env)
    redactor = Redactor().learn_env(full_env)
    notes: list[str] = []
    for attempt in range(PORT_RETRIES + 1):
        report, port_taken = _run_once(
            exe, path, list(args or []), nproc, hang_timeout, timeout, full_env, cwd, stream, redactor, notes
        )
        if not port_taken or attempt == PORT_RETRIES:
            return report
        notes.append(
            "the rendezvous port was taken by another process before torchrun could bind it; retried with a new port"
        )
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass
class _Seen:
    """How the watch over a running job ended: the job exited, or rankscope stopped watching."""

    outcome: RunOutcome | None = None  # None: the job exited by itself (exit_code says how)
    evidence: str | None = None
    exit_code: int | None = None


def _watch_until_done(
    proc: subprocess.Popen[bytes],
    runner: _Runner,
    watch: _Watch,
    start: float,
    timeout: float | None,
    hang_timeout: float | None,
) -> _Seen:
    """Pump the ranks' output and sample their CPU until the job exits, times out or hangs.

    A hang is quiet output for ``hang_timeout`` with idle ranks, or quiet output for much longer
    with busy ones (a rank spinning in a collective looks busy).
    """
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=POLL_INTERVAL)
        now = time.monotonic()
        runner.pump(now)
        if proc.returncode is not None:
            return _Seen(exit_code=proc.returncode)
        watch.sample(now, runner.lines)
        if timeout is not None and now - start >= timeout:
            return _Seen("timeout", f"still running after the {timeout:g}s limit")
        if watch.detector is None:
            continue
        call = watch.detector.judge()
        if call.state == "suspect":
            return _Seen(
                "hung", f"no output from any rank for {now - runner.last_output:.0f}s; {call.detail}"
            )


def _detector(hang_timeout: float | None, start: float) -> StallDetector | None:
    """The stall detector of a run: quiet ``hang_timeout`` with idle ranks, or much longer with busy
    ones (NCCL spins); None when hang detection is off."""
    if hang_timeout is None:
        return None
    return StallDetector(hang_timeout, max(BUSY_QUIET_FACTOR * hang_timeout, BUSY_QUIET_MIN), start)


def _stop_job(
    proc: subprocess.Popen[bytes] | None, runner: _Runner, watch: _Watch | None, notes: list[str]
) -> int:
    """Reap the job's process tree (and sweep what outlived torchrun); the launcher lines worth keeping."""
    stopped_at = len(runner.launcher_lines)
    if proc is None:
        return stopped_at
    if proc.poll() is None:
        runner.pump(time.monotonic())
        stopped_at = len(runner.launcher_lines)
        runner.mute_launcher = True
    with _shielded():
        reap_tree(proc, grace=REAP_GRACE)
        swept = kill_survivors(watch.seen) if watch is not None else []
    if swept:
        notes.append(f"killed {len(swept)} process(es) of the job that outlived torchrun: {swept}")
    return stopped_at


def _run_once(
    exe: str,
    path: Path,
    args: list[str],
    nproc: int,
    hang_timeout: float | None,
    timeout: float | None,
    full_env: dict[str, str],
    cwd: str | None,
    stream: TextIO | None,
    redactor: Redactor,
    notes: list[str],
) -> tuple[RunReport, bool]:
    """One torchrun launch; the bool says it failed only because the port was taken."""
    log_dir = Path(tempfile.mkdtemp(prefix="rankscope-run-"))
    port = net.free_port()
    argv = [
        exe,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "--monitor_interval=0.2",
        "--redirects=3",
        f"--log_dir={log_dir / 'ranks'}",
        str(path),
        *args,
    ]
    runner = _Runner(
        argv=argv,
        log_dir=log_dir / "ranks",
        env=full_env,
        cwd=cwd,
        nproc=nproc,
        stream=stream,
        redactor=redactor,
    )
    launcher_file = log_dir / "torchrun.log"
    runner.launcher.path = launcher_file
    start = time.monotonic()
    runner.last_output = start
    outcome: RunOutcome | None = None
    stacks: StacksReport | None = None
    evidence: str | None = None
    local_notes = list(notes)
    exit_code: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    watch: _Watch | None = None
    try:
        with _sigterm_as_interrupt():
            with open(launcher_file, "wb") as lf:
                try:  # in its own session: a terminal's Ctrl-C reaches rankscope only; rankscope stops the job
                    proc = subproc.start_job(argv, lf, env=full_env, cwd=cwd)
                except OSError as exc:
                    raise InvalidInput(
                        f"could not start torchrun with {exe}: {exc.strerror or exc}.",
                        fix="Pass --python with the interpreter of the training environment (an executable file).",
                    ) from exc
            watch = _Watch(root=proc.pid, detector=_detector(hang_timeout, start))
            seen = _watch_until_done(proc, runner, watch, start, timeout, hang_timeout)
            outcome, evidence, exit_code = seen.outcome, seen.evidence, seen.exit_code
            if outcome == "hung":
                stacks, problem = _capture_stacks(proc.pid, STACKS_TIMEOUT)
                if problem:
                    local_notes.append(problem)
    finally:
        stopped_at = _stop_job(proc, runner, watch, local_notes)
        try:
            runner.pump(time.monotonic(), final=True)
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)
    if proc is None or watch is None:  # Popen raised: InvalidInput is already on its way out
        raise RuntimeError("torchrun did not start")
    return _conclude(
        _Run(path, exe, runner, watch, exit_code, outcome, stacks, evidence, local_notes, start), stopped_at
    )


@dataclass
class _Run:
    """One launch after it stopped: everything _report needs, and what decides its outcome."""

    path: Path
    exe: str
    runner: _Runner
    watch: _Watch
    exit_code: int | None
    outcome: RunOutcome | None
    stacks: StacksReport | None
    evidence: str | None
    notes: list[str]
    start: float


def _conclude(run: _Run, stopped_at: int) -> tuple[RunReport, bool]:
    """The report of one launch; the bool says it failed only because the port was taken."""
    runner, watch, exit_code = run.runner, run.watch, run.exit_code
    launcher_lines = list(runner.launcher_lines)
    if run.outcome in ("hung", "timeout"):
        # what torchrun printed while rankscope stopped it (its SignalException trace) is noise
        launcher_lines = launcher_lines[:stopped_at]
    no_rank_output = not any(rl.out_lines or rl.err_lines for rl in runner.ranks.values())
    if exit_code not in (None, 0) and no_rank_output:
        text = "\n".join(launcher_lines)
        if re.search(r"No module named '?torch", text):
            raise TorchMissing(
                f"{run.path.name} could not start: the interpreter {run.exe} cannot import torch."
            )
        if "EADDRINUSE" in text or "address already in use" in text:
            report = _report(
                "crashed",
                runner,
                watch,
                exit_code,
                run.stacks,
                run.evidence,
                run.notes,
                run.start,
                launcher_lines,
            )
            return report, True
    if watch.rank_pids and all(rl.stdout.path is None for rl in runner.ranks.values()):
        run.notes.append(
            "torchrun wrote no per-rank log files where rankscope looks (<log_dir>/*/attempt_*/<rank>/); "
            "this torch version lays them out differently, so the ranks' output is missing here."
        )
    outcome = run.outcome or ("ok" if exit_code == 0 else "crashed")
    report = _report(
        outcome, runner, watch, exit_code, run.stacks, run.evidence, run.notes, run.start, launcher_lines
    )
    return report, False


def _report(
    outcome: RunOutcome,
    runner: _Runner,
    watch: _Watch,
    exit_code: int | None,
    stacks: StacksReport | None,
    evidence: str | None,
    notes: list[str],
    start: float,
    launcher_lines: list[str],
) -> RunReport:
    duration = time.monotonic() - start
    outputs = [
        RankOutput(
            rank=r,
            pid=watch.rank_pids.get(r),
            stdout=list(rl.out_lines),
            stderr=list(rl.err_lines),
            dropped_lines=rl.dropped,
        )
        for r, rl in sorted(runner.ranks.items())
    ]
    failed = parse_failures(launcher_lines) if outcome == "crashed" else []
    report = RunReport(
        outcome=outcome,
        summary=run_summary(outcome, runner.nproc, exit_code, failed, stacks, evidence, duration),
        exit_code=exit_code if outcome in ("ok", "crashed") else None,
        command=runner.redactor.argv(runner.argv),
        launcher_pid=watch.root,
        nproc=runner.nproc,
        duration_s=round(duration, 2),
        failed_ranks=failed,
        collapsed_stdout=collapse_rank_lines({o.rank: o.stdout for o in outputs}),
        collapsed_stderr=collapse_rank_lines({o.rank: o.stderr for o in outputs}),
        ranks=outputs,
        launcher_output=launcher_lines,
        stacks=stacks,
        hang_evidence=evidence if outcome == "hung" else None,
        notes=notes,
        next_steps=run_next_steps(outcome, failed, stacks),
    )
    return report


# --------------------------------------------------------------------------- MCP-facing variant


def run_all_ranks(
    script: str,
    nproc: int = 2,
    args: list[str] | None = None,
    timeout: float = 120.0,
    hang_timeout: float = 30.0,
) -> RunReport:
    """Run a probe script on ``nproc`` ranks and return a bounded report for an agent.

    Ranks get ``RANKSCOPE_BACKEND`` (``gloo`` without a GPU). The answer keeps
    the collapsed output (about 12 KB at most, the middle cut when longer) and
    drops raw per-rank output; if the job hangs it carries the stacks and the
    verdict (bounded) instead.
    """
    report = run_job(script, args, nproc=nproc, hang_timeout=hang_timeout, timeout=timeout)
    return bound_run_report(report)
