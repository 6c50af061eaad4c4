"""The morning after, read from a watch folder: which incident decides, and what to say beside it.

A watch (``rankscope watch``) captured each suspected stall while the job was still alive; the
capture, judged once, says what a live call at that moment would have said. This picks the
incident that decides for each attempt of the job (the latest one that stayed stalled: an
incident that resumed was a slow phase, never a hang), and says in one line each what a reader
must weigh beside its verdict: when it was captured relative to the job's end, an incident a
killed watcher left incomplete, the slow phases, and the hosts or watcher steps that went away.
Pure: the manifests in, lines out (times are the folder's own, parsed, never the clock).
"""

from __future__ import annotations

from datetime import datetime

from rankscope.models.watch import IncidentManifest, WatchManifest

MAX_SLOW = 3
"""Resumed incidents named one by one; more are counted."""
MAX_HOSTS = 4
"""Hosts gone named one by one; more are counted."""
MAX_ATTEMPTS = 3
"""Earlier attempts given a line each (the latest ones); more are counted."""


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None


def deciding(incidents: list[IncidentManifest]) -> list[IncidentManifest]:
    """Per attempt, the latest incident that stayed stalled, in attempt order."""
    latest: dict[int, IncidentManifest] = {}
    for m in incidents:
        if m.status == "stalled":
            latest[m.attempt] = m  # incidents are read oldest first
    return [latest[n] for n in sorted(latest)]


def when_captured(m: IncidentManifest, watch: WatchManifest) -> str:
    """``captured 41 s before the job ended`` (or why that cannot be said)."""
    at = m.captured_at or m.confirmed_at or m.stall_suspected_at
    before = m.captured_before_end_s
    if before is None:
        before = _seconds(at, m.job_ended_at or _attempt_end(m, watch) or watch.job_ended_at)
    if before is not None:
        return f"captured {before:.0f} s before the job ended"
    if watch.state == "watching":
        return f"captured at {at}; the job was still running when the watch was last written"
    return f"captured at {at}; when the job ended is not recorded"


def _attempt_end(m: IncidentManifest, watch: WatchManifest) -> str | None:
    return next((a.ended_at for a in watch.attempts if a.n == m.attempt), None)


def incomplete(m: IncidentManifest) -> str | None:
    """``incomplete: ...`` for an incident its watcher did not finish (what is missing, what is there)."""
    if m.complete:
        return None
    failed = [p.name for p in m.pieces if not p.ok]
    have = [p.name for p in m.pieces if p.ok]
    said = f"incomplete: the watcher stopped before it finished incident {m.name}"
    if failed:
        said += f" ({', '.join(failed)} failed)"
    return said + (f"; read what is there: {', '.join(have)}" if have else "; no piece was written")


def slow_phases(incidents: list[IncidentManifest]) -> str | None:
    """The resumed incidents, as slow phases: ``slow phases (resumed, not hangs): 001 after 95 s, ...``."""
    resumed = [m for m in incidents if m.status == "resumed"]
    if not resumed:
        return None
    named = [
        f"{m.name} after {m.resumed_after_s:.0f} s" if m.resumed_after_s is not None else m.name
        for m in resumed[:MAX_SLOW]
    ]
    more = f" and {len(resumed) - MAX_SLOW} more" if len(resumed) > MAX_SLOW else ""
    return f"slow phases (the job moved again: not hangs): {', '.join(named)}{more}"


def hosts_gone(watch: WatchManifest, incidents: list[IncidentManifest]) -> list[str]:
    """Every host or watcher step that went away, from the watch and from the incidents, once each."""
    out: dict[str, str] = {}
    for h in watch.hosts:
        if h.state in ("gone", "unreachable"):
            out.setdefault(h.host, f"host {h.host}: {h.state}" + (f" ({h.note})" if h.note else ""))
    for m in incidents:
        for h in m.hosts_missing:
            out.setdefault(
                h.host, f"host {h.host}: missing from {m.name}" + (f" ({h.note})" if h.note else "")
            )
    return list(out.values())


def watch_lines(
    watch: WatchManifest, incidents: list[IncidentManifest], lead: IncidentManifest | None
) -> list[str]:
    """What a reader must weigh beside the verdict, one line each: the lead's completeness, the slow
    phases, the hosts gone; and, when no incident stayed stalled, that none did."""
    lines: list[str] = []
    if lead is not None:
        gap = incomplete(lead)
        if gap:
            lines.append(gap)
    elif incidents:
        lines.append("no incident stayed stalled: every one resumed")
    else:
        lines.append(f"the watch recorded no incident (state: {watch.state})")
    slow = slow_phases(incidents)
    if slow:
        lines.append(slow)
    lines.extend(hosts_gone(watch, incidents))
    return lines


def lead_sentence(m: IncidentManifest, watch: WatchManifest, verdict_summary: str, attempts: int) -> str:
    """``From the watch's capture (incident 002, attempt 2 of 2, captured 41 s before the job ended): ...``."""
    attempt = f", attempt {m.attempt} of {attempts}" if attempts > 1 else ""
    return f"From the watch's capture (incident {m.name}{attempt}, {when_captured(m, watch)}): {verdict_summary}."


def attempt_line(m: IncidentManifest, watch: WatchManifest, verdict_summary: str) -> str:
    """One line for an earlier attempt's stall (its capture timed against that attempt's end)."""
    when = when_captured(m, watch).replace("before the job ended", "before that attempt ended")
    return f"attempt {m.attempt}: incident {m.name}, {when}: {verdict_summary}"


def attempt_lines(earlier: list[tuple[IncidentManifest, str]], watch: WatchManifest) -> list[str]:
    """The earlier attempts' stalls, the latest ``MAX_ATTEMPTS`` a line each, the rest counted."""
    lines = [attempt_line(m, watch, summary) for m, summary in earlier[-MAX_ATTEMPTS:]]
    cut = len(earlier) - MAX_ATTEMPTS
    return ([f"{cut} earlier attempts stalled too (read_watch lists them)"] if cut > 0 else []) + lines


__all__ = [
    "attempt_line",
    "attempt_lines",
    "deciding",
    "hosts_gone",
    "incomplete",
    "lead_sentence",
    "slow_phases",
    "watch_lines",
    "when_captured",
]
