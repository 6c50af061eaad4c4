"""Start a watch (in the foreground, or detached from the terminal), list the watches, read one.

A detached watch is this same command run again without ``--detach``, double-forked into a session
of its own with its stdio in ``DIR/watcher.log`` (:func:`rankscope.runtime.subproc.start_detached`);
the caller waits until its ``watch.json`` says it watches (or it failed), then says where its folder
and pid are. Every watch started here is noted in ``$RANKSCOPE_CACHE_DIR/watches`` so that
``list_watches`` finds them again.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from rankscope.capabilities import watch_folder as wf
from rankscope.capabilities.last_capture import cache_dir
from rankscope.capabilities.watch import WatchConfig, watch
from rankscope.errors import InvalidInput, RankscopeError
from rankscope.models.watch import (
    WATCHER_LOG,
    WatchList,
    WatchManifest,
    WatchStarted,
    WatchSummary,
    WatchView,
)
from rankscope.runtime import procfs, subproc

log = logging.getLogger("rankscope.capabilities.watch_start")

START_TIMEOUT = 90.0
"""Seconds a detached watch may take to find its job and write its first manifest."""

INDEX = "watches"
MAX_LOG_LINES = 5000


def watcher_alive(manifest: WatchManifest) -> bool:
    """Whether the manifest's watcher still runs here (its pid alive and running rankscope watch)."""
    if manifest.watcher_host != _host() or not procfs.is_alive(manifest.watcher_pid):
        return False
    argv = procfs.read_cmdline(manifest.watcher_pid)
    return "watch" in argv and any("rankscope" in a for a in argv)


def _host() -> str:
    from rankscope.capabilities.discovery import this_host

    return this_host()


def _check_out(out: Path) -> Path:
    out = out.expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise InvalidInput(f"--out {out} is a file.", fix="Pass a folder (it is made if missing).")
    if wf.is_watch_folder(out):
        try:
            old = wf.read_watch(out)
        except RankscopeError:
            return out
        if watcher_alive(old):
            raise InvalidInput(
                f"a watch (pid {old.watcher_pid}) already writes to {out}.",
                fix="Pass another --out folder, or stop that watch first (kill -TERM its pid).",
            )
    return out


def _note(out: Path) -> None:
    """Add ``out`` to the index of watches (a line per folder)."""
    index = cache_dir() / INDEX
    try:
        wf.make_dir(index.parent)
        known = index.read_text(encoding="utf-8").splitlines() if index.is_file() else []
        if str(out) not in known:
            wf.write_bytes(index, "\n".join([*known[-199:], str(out)]).encode() + b"\n")
    except OSError as exc:
        log.warning("could not note the watch in %s: %s", index, exc)


def run_watch(config: WatchConfig) -> WatchManifest:
    """A watch in the foreground: until the job ends, or SIGTERM/SIGINT stop it."""
    out = _check_out(config.out)
    _note(out)
    if config.selection.hosts or config.selection.via:
        from rankscope.capabilities.watch_hosts import HostsWatcher

        logging.getLogger("rankscope.capabilities.watch_hosts").setLevel(logging.INFO)
        return watch(_with_out(config, out), HostsWatcher)
    return watch(_with_out(config, out))


def _with_out(config: WatchConfig, out: Path) -> WatchConfig:
    from dataclasses import replace

    return replace(config, out=out)


def detach_argv(config: WatchConfig) -> list[str]:
    """The command a detached watch runs: this one again, in the foreground, with the same choices."""
    s = config.selection
    argv = [sys.executable, "-m", "rankscope", "watch", "--out", str(config.out)]
    pairs: list[tuple[str, object]] = [
        ("--pid", s.pid),
        ("--job", s.slurm_job or s.job_id),
        ("--hosts", ",".join(s.hosts) if s.hosts else None),
        ("--via", s.via),
        ("--interval", config.interval_s),
        ("--stall", config.stall_s),
        ("--busy-stall", config.busy_stall_s),
        ("--confirm", config.confirm_s),
        ("--resume", config.resume_s),
        ("--job-timeout", config.job_timeout_s),
        ("--linger", config.linger_s),
        ("--max-incidents", config.max_incidents),
        ("--max-incident-bytes", config.max_incident_bytes),
        ("--window", config.options.window),
        ("--timeout", config.options.timeout),
    ]
    for flag, value in pairs:
        if value is not None:
            argv += [flag, str(value)]
    if config.options.native:
        argv.append("--native")
    return argv


def start_watch(config: WatchConfig) -> WatchStarted:
    """Start a watch detached from the terminal; where its folder, log and pid are."""
    out = _check_out(config.out)
    wf.make_dir(out)
    config = _with_out(config, out)
    log_path = out / WATCHER_LOG
    try:
        pid = subproc.start_detached(detach_argv(config), str(log_path), cwd=config.selection.folder)
    except OSError as exc:
        raise InvalidInput(
            f"could not start the watch: {exc}", fix="Check that rankscope runs: `rankscope --version`."
        ) from exc
    _note(out)
    manifest = _wait_started(out, pid, log_path)
    return WatchStarted(
        dir=str(out),
        watcher_pid=pid,
        log=str(log_path),
        job_id=manifest.job_id,
        summary=(
            f"watching job {manifest.job_id} (stall after {manifest.settings.stall_s:g}s quiet; its timeout "
            f"{manifest.settings.job_timeout_s or 0:g}s from {manifest.settings.job_timeout_source}); folder "
            f"{out}, watcher pid {pid}; it stops when the job ends"
        ),
        next_steps=[
            f"read it: rankscope triage {out} (MCP: read_watch dir={out})",
            f"stop it: kill -TERM {pid}",
        ],
    )


def _wait_started(out: Path, pid: int, log_path: Path) -> WatchManifest:
    """The detached watch's first manifest, once it wrote one; its error if it died first."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if wf.is_watch_folder(out):
            try:
                manifest = wf.read_watch(out)
            except RankscopeError:
                manifest = None
            if manifest is not None and manifest.watcher_pid == pid:
                return manifest
        if not procfs.is_alive(pid):
            tail = _log_tail(log_path)
            raise InvalidInput(f"the watch stopped before it watched anything:\n{tail}", fix=_fix_of(tail))
        time.sleep(0.2)
    raise InvalidInput(
        f"the watch (pid {pid}) wrote no manifest in {START_TIMEOUT:g}s",
        fix=f"Read {log_path}; stop it with kill -TERM {pid} if it is stuck.",
    )


def _log_tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _fix_of(tail: str) -> str:
    fix = next((ln[len("Fix: ") :] for ln in tail.splitlines() if ln.startswith("Fix: ")), None)
    return fix or "Read the watcher's log above; `rankscope ps` lists the jobs a watch can choose."


def list_watches(dirs: list[str] | None = None) -> WatchList:
    """The watches under ``dirs`` (each a watch folder), else every watch started on this host."""
    index = cache_dir() / INDEX
    if dirs is None:
        dirs = index.read_text(encoding="utf-8").splitlines() if index.is_file() else []
    out = WatchList()
    for d in dict.fromkeys(reversed(dirs)):
        folder = Path(d)
        if not wf.is_watch_folder(folder):
            continue
        try:
            m = wf.read_watch(folder)
        except RankscopeError as exc:
            out.notes.append(exc.message)
            continue
        out.watches.append(
            WatchSummary(
                dir=str(folder),
                state=m.state,
                watcher_pid=m.watcher_pid,
                watcher_alive=watcher_alive(m),
                job_id=m.job_id,
                started_at=m.started_at,
                attempts=len(m.attempts),
                incidents=len(m.incidents),
                last_incident=m.incidents[-1] if m.incidents else None,
            )
        )
    if not out.watches:
        out.notes.append("no watch found; start one beside a running job: rankscope watch --out DIR --detach")
    return out


def read_watch(folder: str) -> WatchView:
    """One watch folder read back: the watch and each incident's manifest."""
    path = Path(folder).expanduser()
    manifest = wf.read_watch(path)
    return wf.read_view(path, alive=watcher_alive(manifest))


__all__ = ["detach_argv", "list_watches", "read_watch", "run_watch", "start_watch", "watcher_alive"]
