"""What a watch costs the job it watches, and what it costs itself: `rankscope watch` beside a real
4-rank gloo job, side by side with the same job unwatched, alternating.

    .venv/bin/python benchmarks/bench_watch.py [--repeats 3] [--window 20] [--no-hang] \
        [--out benchmarks/results/watch.md]

1. Step time. One job (tests/programs/steady_steps.py: short, regular steps; rank 0 prints each
   step's wall time, so step time is taken inside the job) runs throughout. Windows of ``--window``
   seconds alternate: unwatched, watched (a detached `rankscope watch --pid` with its default
   settings, started before the window and stopped by SIGTERM after it), ``--repeats`` times
   (ABAB...). Each window's median step time; the medians of the windows of each arm; their ratio,
   and the median of the per-pair ratios. The watcher's start (interpreter, discovery) falls
   outside the windows: it is paid once per watch and reported apart.
2. The watcher's CPU over the watched windows (utime + stime from its /proc/PID/stat), per hour.
3. Its disk: bytes written (wchar from its /proc/PID/io) and the folder's growth over the watched
   windows, with no incident, per day.
4. A hang (tests/programs/watch_jobs.py --mode data, a rank blocked in a data read, the job's own
   timeout 30 s), under a watch with its default settings: time from the stall (the rank's
   ``stalling`` readiness file) to the incident's capture (manifest complete), beside the job's
   timeout; and the bytes one incident holds once the job has ended.

The machine is shared: every figure comes with the load average around its run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.jobs import JobFactory, RunningJob, run_cli, wait_for  # noqa: E402

from rankscope.capabilities import watch_folder as wf  # noqa: E402
from rankscope.runtime import procfs  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
HANG_TIMEOUT_S = 30


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far."""
    fields = procfs.stat_fields(pid) or []
    return (int(fields[11]) + int(fields[12])) / TICKS if len(fields) > 12 else 0.0


def wchar(pid: int) -> int:
    """Bytes a process passed to write() so far."""
    for line in (procfs.read_text(pid, "io") or "").splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def step_times(job: RunningJob, start: float, end: float) -> list[float]:
    """Rank 0's step times (seconds between consecutive step stamps) that fall in [start, end]."""
    stamps = [
        float(line.rsplit("t=", 1)[1])
        for line in job.output().splitlines()
        if line.startswith("step ") and " t=" in line
    ]
    inside = [t for t in stamps if start <= t <= end]
    return [b - a for a, b in itertools.pairwise(inside)]


def start_watch(pid: int, out: Path) -> int:
    """A detached watch with its default settings; its pid once it samples (its first attempt saved)."""
    done = run_cli("watch", "--pid", str(pid), "--out", str(out), "--detach", "--json", timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"rankscope watch failed: {done.stderr[-800:]}")
    started = int(json.loads(done.stdout)["watcher_pid"])

    def sampling() -> bool:
        try:
            return wf.read_watch(out).state == "watching" and bool(wf.read_watch(out).attempts)
        except Exception:  # not written yet
            return False

    wait_for(sampling, 300, f"the watch in {out} to start sampling", 0.1)
    return wf.read_watch(out).watcher_pid or started


def stop_watch(pid: int) -> None:
    if procfs.is_alive(pid):
        os.kill(pid, signal.SIGTERM)
    try:
        wait_for(lambda: not procfs.is_alive(pid), 30, f"watcher {pid} to stop", 0.1)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)


@dataclass
class Arms:
    plain: list[float] = field(default_factory=list)
    watched: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    startup_cpu: list[float] = field(default_factory=list)
    cpu: float = 0.0
    seconds: float = 0.0
    written: int = 0
    grown: int = 0


def watched_window(job: RunningJob, out: Path, window: float, arms: Arms) -> None:
    watcher = start_watch(job.pid, out)
    try:
        cpu0, w0, f0 = cpu_s(watcher), wchar(watcher), folder_bytes(out)
        arms.startup_cpu.append(cpu0)
        t0 = time.time()
        time.sleep(window)
        t1 = time.time()
        cpu1, w1, f1 = cpu_s(watcher), wchar(watcher), folder_bytes(out)
    finally:
        stop_watch(watcher)
    times = step_times(job, t0, t1)
    arms.watched.append(statistics.median(times))
    arms.steps.append(len(times))
    arms.cpu += cpu1 - cpu0
    arms.seconds += t1 - t0
    arms.written += w1 - w0
    arms.grown += f1 - f0


def measure_steps(factory: JobFactory, tmp: Path, repeats: int, window: float) -> Arms:
    job = factory.torchrun("steady_steps.py", nproc=4)
    job.wait_ready([f"up-rank{r}" for r in range(4)], timeout=300)
    arms = Arms()
    for i in range(repeats):
        t0 = time.time()
        time.sleep(window)
        times = step_times(job, t0, time.time())
        arms.plain.append(statistics.median(times))
        arms.steps.append(len(times))
        watched_window(job, tmp / f"watch-{i}", window, arms)
    job.stop()
    return arms


@dataclass
class Hang:
    stall_to_capture_s: float
    stall_to_suspect_s: float
    stall_s: float
    timeout_s: float
    timeout_source: str
    incident_bytes: int
    before_end_s: float | None
    pieces: list[str]


def measure_hang(factory: JobFactory, tmp: Path) -> Hang:
    go = tmp / "go"
    job = factory.torchrun(
        "watch_jobs.py",
        nproc=4,
        args=["--mode", "data", "--odd", "2", "--dist-timeout", str(HANG_TIMEOUT_S), "--go", str(go)],
    )
    job.wait_ready([f"up-rank{r}" for r in range(4)], timeout=300)
    out = tmp / "watch-hang"
    watcher = start_watch(job.pid, out)
    try:
        go.touch()
        job.wait_ready(["stalling"], timeout=120)
        stalled = (job.ready_dir / "stalling").stat().st_mtime

        def captured() -> bool:
            paths = wf.incident_paths(out)
            return bool(paths) and wf.read_incident(paths[0]).complete

        wait_for(captured, 300, "the incident to be captured", 0.05)
        seen = time.time()
        job.wait_exit(300, "the hung job to end by its own timeout")
        wait_for(lambda: wf.read_watch(out).state != "watching", 120, "the watch to see the job end", 0.2)
    finally:
        stop_watch(watcher)
    path = wf.incident_paths(out)[0]
    incident = wf.read_incident(path)
    settings = wf.read_watch(out).settings
    suspected = wf.parse_utc(incident.stall_suspected_at).timestamp()
    return Hang(
        stall_to_capture_s=seen - stalled,
        stall_to_suspect_s=suspected - stalled,
        stall_s=settings.stall_s,
        timeout_s=settings.job_timeout_s,
        timeout_source=settings.job_timeout_source,
        incident_bytes=folder_bytes(path),
        before_end_s=incident.captured_before_end_s,
        pieces=[p.name for p in incident.pieces if p.ok],
    )


def report(a: argparse.Namespace, arms: Arms, hang: Hang | None, loads: list[str]) -> str:
    plain, watched = statistics.median(arms.plain), statistics.median(arms.watched)
    pairs = [w / p for p, w in zip(arms.plain, arms.watched, strict=True)]
    per_hour = arms.cpu / arms.seconds * 3600
    rows = [
        f"# Watch overhead ({time.strftime('%Y-%m-%d')}, 4 gloo ranks, {a.repeats} alternating "
        f"{a.window:.0f} s windows per arm; load average {' -> '.join(loads)} on {os.cpu_count()} CPUs)",
        "",
        "| what | unwatched | watched | ratio |",
        "|---|---|---|---|",
        f"| job step time, median of window medians | {plain * 1000:.1f} ms | {watched * 1000:.1f} ms "
        f"| **{watched / plain:.3f}×** |",
        f"| per pair (ABAB) | {', '.join(f'{x * 1000:.1f}' for x in arms.plain)} ms "
        f"| {', '.join(f'{x * 1000:.1f}' for x in arms.watched)} ms "
        f"| {', '.join(f'{r:.3f}' for r in pairs)} (median **{statistics.median(pairs):.3f}×**) |",
        "",
        f"Steps per window: {', '.join(map(str, arms.steps))}.",
        "",
        "| the watcher (default settings, interval 2 s) | measured | scaled |",
        "|---|---|---|",
        f"| CPU while watching | {arms.cpu:.2f} s in {arms.seconds:.0f} s | **{per_hour:.0f} s per hour** "
        f"({arms.cpu / arms.seconds * 100:.2f} % of one core) |",
        f"| CPU to start (interpreter, discovery, the job's timeout) | median "
        f"{statistics.median(arms.startup_cpu):.2f} s | once per watch |",
        f"| bytes written (wchar), no incident | {arms.written:,} B in {arms.seconds:.0f} s "
        f"| **{arms.written / arms.seconds * 86400 / 1e6:.2f} MB per day** |",
        f"| the folder's growth, no incident | {arms.grown:,} B in {arms.seconds:.0f} s "
        f"| {arms.grown / arms.seconds * 86400 / 1e6:.2f} MB per day |",
    ]
    if hang is not None:
        rows += [
            "",
            f"| a hang (a rank blocked in a data read; job timeout {hang.timeout_s:.0f} s from "
            f"{hang.timeout_source}, stall threshold {hang.stall_s:.0f} s) | measured |",
            "|---|---|",
            f"| stall -> suspected | {hang.stall_to_suspect_s:.1f} s (the folder's times are to the second) |",
            f"| stall -> incident captured | **{hang.stall_to_capture_s:.1f} s = "
            f"{hang.stall_to_capture_s / hang.timeout_s:.2f}× the job's timeout** |",
            f"| captured before the job ended | {hang.before_end_s} s |",
            f"| one incident on disk (once the job ended) | **{hang.incident_bytes:,} B** "
            f"({', '.join(hang.pieces)}) |",
        ]
    return "\n".join([*rows, ""])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3, help="pairs of windows (unwatched, watched)")
    p.add_argument("--window", type=float, default=20.0, help="seconds per window")
    p.add_argument("--no-hang", action="store_true", help="skip the hang (stall-to-capture) part")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "watch.md")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a stopped run still reaps its jobs and watches
    loads = [load()]
    with tempfile.TemporaryDirectory() as tmp:
        factory = JobFactory(Path(tmp))
        try:
            arms = measure_steps(factory, Path(tmp), a.repeats, a.window)
            hang = None if a.no_hang else measure_hang(factory, Path(tmp))
        finally:
            factory.cleanup()
    loads.append(load())
    text = report(a, arms, hang, loads)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
