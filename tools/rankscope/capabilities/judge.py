"""One verdict from one capture's evidence: one host's, or the merge of every host's.

A capture (:func:`rankscope.capabilities.stacks.capture`: the window, the stacks, the recorder,
RAS, the source lines, the counters, the busy workers of the ranks that wait on them) is evidence,
never a verdict; this is the one place evidence is judged, for the local call and for a
multi-host one alike, so both give the same answer. The verdict runs once. Only when it leaves a
hang open does it ask what a capture cannot: the job's store (which rank's watchdog fired first,
a note) and, when no recorder was found and some rank listens where worker servers bind, the
job's debug server, whose recorder is then judged with the rest: the verdict's second and last run.
"""

from __future__ import annotations

from rankscope.analysis.code_origin import label_stacks
from rankscope.analysis.hang.progress_verdict import PROGRESS_KINDS
from rankscope.analysis.hang.stacks import analyze
from rankscope.analysis.startup import startup_verdict
from rankscope.capabilities.recorder.pickup import debug_server_flight, exception_dump_note
from rankscope.capabilities.workers import with_workers
from rankscope.models.core import Job, StacksReport, Verdict
from rankscope.models.flight import FlightReport
from rankscope.models.look import HostLook
from rankscope.options import DEFAULTS, DumpOptions


def _verdict(look: HostLook, job: Job, flight: FlightReport | None) -> StacksReport:
    source = {(s.file, s.line): s.text for s in look.source}
    stacks = label_stacks(
        look.stacks, look.code_roots
    )  # merged from other hosts: their frames lost their origins
    return analyze(job, stacks, look.errors, flight, source=source, ras=look.ras, progress=look.progress)


def _open(report: StacksReport, options: DumpOptions) -> bool:
    """A hang the evidence leaves unsure, where the options allow asking the recorder's sources."""
    v = report.verdict
    return options.flight_recorder and v.kind not in PROGRESS_KINDS and v.confidence != "high"


def _startup(look: HostLook, job: Job, remote: bool) -> StacksReport | None:
    """The start-up verdict on a job whose launchers wait in rendezvous or whose ranks all wait
    before their first collective (``analysis/startup.py``); None when it is past start-up. A job
    that moves in the window keeps its progress verdict: a slow start is not a hang."""
    report = _verdict(look, job, look.flight) if job.ranks else None
    if report is not None and report.verdict.kind in PROGRESS_KINDS:
        return report
    ruled = startup_verdict(report.job if report else job, look.startup, look.stacks, remote=remote)
    if ruled is None:
        return report if not job.ranks else None
    verdict, _ = ruled
    if report is None:
        return StacksReport(verdict=verdict, job=job, errors=look.errors)
    return report.model_copy(update={"verdict": verdict})


def judge_look(look: HostLook, options: DumpOptions = DEFAULTS, *, remote: bool = False) -> StacksReport:
    """The verdict on ``look`` (its job must be set), with the follow-ups an open hang needs and the
    busy workers of the ranks it names. A job in start-up gets the start-up verdict; ``remote``:
    the look merges every host of the call (a host with no launcher of the job is then named)."""
    if look.job is None:  # pragma: no cover - a look without a job is a choice or an absence, never judged
        raise ValueError("a look without a job has nothing to judge")
    if look.startup:
        started = _startup(look, look.job, remote)
        if started is not None:
            return started
    if not look.job.ranks:
        return StacksReport(
            verdict=Verdict(kind="inconclusive", confidence="low", summary="No rank of the job runs yet."),
            job=look.job,
            errors=look.errors,
        )
    report = _verdict(look, look.job, look.flight)
    if not _open(report, options):
        return with_workers(report, look.workers)
    # reading the store imports torch only for an older store dialect; it is asked for open hangs alone
    told = exception_dump_note(report.job)
    notes = [*look.job.notes, *([told] if told else [])]
    flight = None if look.flight is not None else debug_server_flight(report.job, look.worker_servers)
    if flight is not None:
        said = f"flight recorder: {len(flight.dumps)} trace(s) from the job's debug server, analysed with the stacks"
        report = _verdict(look, look.job.model_copy(update={"notes": [*notes, said]}), flight)
    elif told:
        report = report.model_copy(update={"job": report.job.model_copy(update={"notes": notes})})
    return with_workers(report, look.workers)


__all__ = ["judge_look"]
