"""`rankscope triage <watch folder>`: the morning after in one call.

A watch captured each suspected stall while the job was alive: every host's look (stacks, source
lines, the progress window, the recorder), as a live ``stacks`` call takes them. Here the looks of
the incident that decides (per attempt, the latest that stayed stalled) are merged as a
multi-host call merges them and judged once (:func:`~rankscope.capabilities.remote.judge_looks`),
so the answer leads with what a live call made at the stall would have said: the rank, the line,
the guard, the fix. No live follow-up is asked (the job is gone: no store, no debug server).
The job's logs beside it (the incident's log tails, and any log paths given with the folder) are
read by the normal log triage, whose findings come after the capture's verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rankscope.analysis.ranges import merge_rank_lines
from rankscope.analysis.triage.logs import unique_steps
from rankscope.analysis.triage.postmortem import LIVE_ONLY_TOOLS
from rankscope.analysis.triage.silent import beyond_timeouts
from rankscope.analysis.triage.watch_incidents import attempt_lines, deciding, lead_sentence, watch_lines
from rankscope.capabilities.watch_folder import incident_paths, read_incident, read_looks, read_watch
from rankscope.errors import InvalidInput, RankscopeError
from rankscope.models.core import NextStep, StacksReport, Verdict
from rankscope.models.logs import LogSource, TriageReport
from rankscope.models.watch import IncidentManifest, WatchManifest
from rankscope.options import DumpOptions

DEAD = DumpOptions(flight_recorder=False)
"""Judge the capture alone: the job is gone, so its store and debug server are not asked."""


def _judge(path: Path, sources: list[LogSource]) -> StacksReport | None:
    """The one verdict on an incident's looks, merged; None when it holds no look of the job."""
    from rankscope.capabilities.remote import judge_looks

    looks = [lk for lk in read_looks(path) if lk.job is not None]
    for lk in looks:
        sources.append(LogSource(path=str(path / f"look-{lk.host}.json"), kind="saved_stacks"))
    if not looks:
        return None
    try:
        return judge_looks({lk.host: lk for lk in looks}, [lk.host for lk in looks], [], DEAD)
    except RankscopeError:
        return None


def _dead_steps(verdict: Verdict) -> list[NextStep]:
    """The verdict's steps a dead job can still take (no second dump, no repro from a live capture)."""
    return [
        s
        for s in verdict.next_steps
        if s.tool not in LIVE_ONLY_TOOLS and not (s.args or {}).get("from_last_stacks")
    ]


def _incidents(folder: Path) -> tuple[list[tuple[Path, IncidentManifest]], list[str]]:
    read: list[tuple[Path, IncidentManifest]] = []
    notes: list[str] = []
    for path in incident_paths(folder):
        try:
            read.append((path, read_incident(path)))
        except InvalidInput as exc:
            notes.append(exc.message)
    return read, notes


AT_END = ".logs_at_end.log"
"""The watcher's tail of an output file at the job's end, beside the tail taken at the incident."""


def _tails(folder: Path) -> list[str]:
    """The log tails of an incident: of an output file tailed twice, the tail at the job's end alone
    (it holds the timeouts and the failures; both would say the same lines twice)."""
    if not folder.is_dir():
        return []
    names = {p.name for p in folder.iterdir() if p.is_file()}
    twins = {n[: -len(AT_END)] + ".log" for n in names if n.endswith(AT_END)}
    return [str(folder / n) for n in sorted(names - twins)]


ReadLogs = Callable[..., TriageReport]
"""The normal log triage (``capabilities.triage.triage_logs``), handed in by its caller."""


def _logs(
    read_logs: ReadLogs, lead: Path | None, others: list[str], max_findings: int, read_code: bool
) -> TriageReport:
    """The normal log triage of the lead incident's log tails and the log paths given beside the folder
    (the code the logs point into is read only when no capture decides)."""
    paths = [*(_tails(lead / "logs") if lead is not None else []), *others]
    if not paths:
        return TriageReport()
    try:
        return read_logs(paths, max_findings=max_findings, read_code=read_code)
    except RankscopeError as exc:
        return TriageReport(summary="", evidence=[f"logs: {exc.message}"])


def triage_watch(
    folder: Path, others: list[str], read_logs: ReadLogs, *, max_findings: int = 50
) -> TriageReport:
    """One answer from a watch folder (and any log paths given with it, read by ``read_logs``, the
    normal log triage): the capture's verdict first."""
    watch = read_watch(folder)
    read, notes = _incidents(folder)
    manifests = [m for _, m in read]
    where = {m.name: p for p, m in read}
    sources: list[LogSource] = []
    judged = [(m, _judge(where[m.name], sources)) for m in deciding(manifests)]
    judged = [(m, r) for m, r in judged if r is not None] or judged[-1:]
    lead_m, lead_r = judged[-1] if judged else (None, None)
    logs = _logs(read_logs, where[lead_m.name] if lead_m else None, others, max_findings, lead_r is None)
    lines = watch_lines(watch, manifests, lead_m)
    lines += attempt_lines([(m, r.verdict.summary) for m, r in judged[:-1] if r is not None], watch)
    lines += notes
    if lead_m is not None and lead_r is None:
        lines.append(f"incident {lead_m.name} holds no look of the job's ranks: nothing to judge")
    report = _compose(watch, lead_m, lead_r, logs, len(watch.attempts) or 1)
    return report.model_copy(update={"watch": lines, "sources": [*sources, *logs.sources]})


def _compose(
    watch: WatchManifest,
    lead: IncidentManifest | None,
    judged: StacksReport | None,
    logs: TriageReport,
    attempts: int,
) -> TriageReport:
    """The capture's verdict leads (its suspects, evidence and steps); the logs' answer follows, less
    what the capture says better (the timeouts, who waited), their evidence lines left to their findings."""
    if lead is None or judged is None:
        said_logs = f" Logs: {logs.summary}" if logs.summary and logs.findings else ""
        summary = "The watch holds no capture of a stall that stayed." + said_logs
        return logs.model_copy(update={"summary": summary.strip()})
    v = judged.verdict
    rest = beyond_timeouts(logs.summary, logs.suspect_ranks, logs.victim_ranks) if logs.findings else ""
    said_logs = f" Logs: {rest}" if rest else ""
    suspects = v.suspect_ranks or logs.suspect_ranks
    log_steps = [s for s in logs.next_steps if s.tool not in LIVE_ONLY_TOOLS] if rest else []
    steps = unique_steps(_dead_steps(v), log_steps)[:6]
    playbook = next((s.skill_section for s in steps if s.skill_section), None) or logs.playbook
    return logs.model_copy(
        update={
            "summary": lead_sentence(lead, watch, v.summary.rstrip("."), attempts) + said_logs,
            "suspect_ranks": suspects,
            "victim_ranks": sorted(set(logs.victim_ranks) - set(suspects)),
            "decided_by": "watch",
            "evidence": merge_rank_lines(v.evidence),
            "stacks": v.model_copy(update={"evidence": [], "next_steps": []}),
            "next_steps": steps,
            "playbook": playbook,
        }
    )


__all__ = ["triage_watch"]
