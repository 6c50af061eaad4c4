"""Lines for the watch answers: where a watch runs, the watches here, one watch folder read back."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.models.watch import IncidentView, WatchList, WatchStarted, WatchView


def render_started(started: WatchStarted) -> Iterator[str]:
    yield started.summary
    yield f"folder: {started.dir}"
    yield f"watcher pid: {started.watcher_pid} (log: {started.log})"
    for step in started.next_steps:
        yield f"next: {step}"


def render_watches(found: WatchList) -> Iterator[str]:
    for w in found.watches:
        alive = "running" if w.watcher_alive else "not running"
        last = f", last {w.last_incident}" if w.last_incident else ""
        yield (
            f"{w.dir}: {w.state} (watcher {w.watcher_pid} {alive}), job {w.job_id}, "
            f"{w.attempts} attempt(s), {w.incidents} incident(s){last}"
        )
    yield from found.notes


def _incident(view: IncidentView) -> str:
    m = view.manifest
    status = f"resumed after {m.resumed_after_s:g}s (a slow phase)" if m.status == "resumed" else "stalled"
    end = (
        f"; captured {m.captured_before_end_s:g}s before the job ended"
        if m.captured_before_end_s is not None
        else ""
    )
    complete = "complete" if m.complete else "INCOMPLETE (the watcher stopped mid-capture)"
    return (
        f"{m.name}: attempt {m.attempt}, {status}, quiet {m.quiet_s:g}s, {complete}{end}; "
        f"pieces: {', '.join(p.name for p in m.pieces) or 'none'}"
    )


def render_watch(view: WatchView) -> Iterator[str]:
    w = view.watch
    s = w.settings
    alive = "running" if view.watcher_alive else "not running"
    yield f"watch of job {w.job_id}: {w.state} (watcher {w.watcher_pid} on {w.watcher_host}, {alive})"
    yield (
        f"stall after {s.stall_s:g}s quiet (busy: {s.busy_stall_s or 0:g}s); the job's timeout "
        f"{s.job_timeout_s or 0:g}s ({s.job_timeout_source}: {s.job_timeout_note})"
    )
    if w.job_ended_at:
        yield f"job ended at {w.job_ended_at}; {len(w.attempts)} attempt(s)"
    for view_i in view.incidents:
        yield _incident(view_i)
    if not view.incidents:
        yield "no incident: the job never stalled while watched"
    yield from view.notes
    if view.incidents:
        yield f"next: rankscope triage {view.dir}"


__all__ = ["render_started", "render_watch", "render_watches"]
