"""Bounded answers: every group and the suspects, without every rank's full stack.

An agent's context is the scarce resource. A 64-rank dump with native frames is hundreds
of kilobytes of near-identical stacks; what the agent needs is the list of groups, who
the suspects are, and the frames where the groups differ. Full stacks of named ranks
come only on request (``full_ranks``).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, cast

from rankscope.analysis.hang.collectives import classify_native_frame, frame_key
from rankscope.analysis.hang.frames import is_torch_or_stdlib, short_path
from rankscope.analysis.hang.progress_verdict import PROGRESS_KINDS
from rankscope.analysis.ranges import merge_rank_lines, rank_ranges
from rankscope.analysis.sizing.fit import size_of
from rankscope.models.compact import compact
from rankscope.models.core import (
    Finding,
    Frame,
    Group,
    Job,
    JobList,
    MissingRank,
    RankProcess,
    RankStack,
    StacksReport,
)
from rankscope.models.env import EnvReport
from rankscope.models.flight import FlightReport, FrDump, FrEntry, FrMismatch, FrProcessGroup, FrRankProgress
from rankscope.models.logs import TriageReport
from rankscope.models.progress import Progress
from rankscope.models.repro import TemplateList

_FRAME_STEPS = (16, 8, 4, 2)
RANKS_CUT = "job.ranks lists only the first rank, the suspects and full_ranks; found: "
"""How the note that sums up the ranks a bounded answer leaves out of job.ranks begins."""
_MAX_ERRORS = 20
_MAX_GROUPS = 32


def _key(frame: Frame) -> tuple[str, str, int]:
    return frame_key(frame.function, frame.file, frame.line)


def _common_outer(groups: list[Group]) -> int:
    """How many outermost frames all groups share (py-spy order is innermost first)."""
    stacks = [g.frames for g in groups if g.frames]
    if len(stacks) < 2:
        return 0
    n = 0
    while all(len(s) > n for s in stacks) and len({_key(s[-1 - n]) for s in stacks}) == 1:
        n += 1
    return n


def _slim_frame(frame: Frame) -> Frame:
    update: dict[str, object] = {"locals": None, "file": short_path(frame.file)}
    if frame.native:
        update["module"] = None
    return frame.model_copy(update=update)


def _trim(frames: list[Frame], common: int, limit: int) -> list[Frame]:
    """Frames down to where this group joins the others (plus one shared frame for context).

    Kept: the innermost Python frame (the op), every frame outside torch and the stdlib (the
    job's code, or a library it installed), and the native frames that carry communication
    meaning (c10d, gloo, NCCL). torch's own plumbing between them (``Module._call_impl``,
    logging wrappers) says nothing the call site does not.
    """
    keep_until = len(frames) - common + 1 if common else len(frames)
    out: list[Frame] = []
    innermost = next((i for i, f in enumerate(frames) if not f.native), None)
    for i, frame in enumerate(frames[: max(keep_until, 1)]):
        if frame.native and classify_native_frame(frame.function) is None:
            continue
        if not frame.native and i != innermost and is_torch_or_stdlib(frame):
            continue
        out.append(_slim_frame(frame))
    if len(out) > limit:
        out = [*out[: limit - 1], out[-1]]
    return out


def _bounded_groups(groups: list[Group], limit: int) -> list[Group]:
    common = _common_outer(groups)
    return [g.model_copy(update={"frames": _trim(g.frames, common, limit)}) for g in groups[:_MAX_GROUPS]]


def _stub(stack: RankStack, groups: list[Group], backend: str | None) -> RankStack:
    """A suspect's stack without its threads, and without its group tables: the verdict's evidence
    already says what they decided. Its op, call site and wait are its group's, said there once;
    its backend is the job's."""
    update: dict[str, object] = {"threads": [], "group_locals": None}
    mine = next((g for g in groups if stack.rank in g.ranks), None)
    if mine is not None and (mine.op, mine.call_site, mine.wait) == (stack.op, stack.call_site, stack.wait):
        update.update({"op": None, "op_evidence": None, "call_site": None, "wait": None})
    if backend is not None and stack.backend == backend:
        update["backend"] = None
    return stack.model_copy(update=update)


def _slim_rank(proc: RankProcess, cmdline: int = 0) -> RankProcess:
    """A rank named for who it is (rank, pid, host, state), with the first ``cmdline`` words."""
    return proc.model_copy(
        update={"cmdline": proc.cmdline[:cmdline], "python": None, "rank_source": "", "local_rank": None}
    )


def _new_splits(report: StacksReport) -> list[Group]:
    """Whole-stack groups that say something the op groups do not: a group whose ranks are exactly
    an op group's would repeat its frames, so only groups that split an op group are kept."""
    op_sets = {tuple(g.ranks) for g in report.groups}
    return [g for g in report.stack_groups if tuple(g.ranks) not in op_sets]


def _missing_once(report: StacksReport) -> list[MissingRank]:
    """One detail per status: 64 ranks on another host say it once."""
    seen_status: set[str] = set()
    missing = []
    for m in report.job.missing:
        missing.append(m if m.status not in seen_status else m.model_copy(update={"detail": ""}))
        seen_status.add(m.status)
    return missing


def _bounded_job(report: StacksReport, wanted: set[int], suspects: set[int]) -> Job:
    """The job with its first rank, the suspects and ``full_ranks`` (the rest summed up in a note),
    each missing rank's status explained once, and no second copy of the first next step."""
    ranks_all = report.job.ranks
    keep_ranks = [
        r if r.rank in wanted else _slim_rank(r, cmdline=8 if r is ranks_all[0] else 0)
        for r in ranks_all
        if r is ranks_all[0] or r.rank in wanted or r.rank in suspects
    ]
    notes = list(report.job.notes)
    if len(keep_ranks) < len(ranks_all):
        by_host: dict[str, list[int]] = {}
        pids_on: dict[str, list[int]] = {}
        for r in ranks_all:
            pids_on.setdefault(r.host, []).append(r.pid)
            if r.rank is not None:
                by_host.setdefault(r.host, []).append(r.rank)
        if len(pids_on) > 1:  # pid numbers repeat across hosts: each host's with its ranks
            found = "; ".join(
                f"ranks {rank_ranges(v)} on {h} (pids {rank_ranges(sorted(pids_on[h]))})"
                for h, v in by_host.items()
            )
        else:
            found = "; ".join(f"ranks {rank_ranges(v)} on {h}" for h, v in by_host.items())
            found += f" (pids {rank_ranges(sorted(r.pid for r in ranks_all))})"
        notes.append(RANKS_CUT + found)
    missing = _missing_once(report)
    recorder = report.job.recorder
    if recorder is not None and any(step.action == recorder for step in report.verdict.next_steps):
        recorder = None  # the first next step already says it
    return report.job.model_copy(  # how the backend was read: list_jobs(details=true) says
        update={
            "ranks": keep_ranks,
            "notes": notes,
            "missing": missing,
            "recorder": recorder,
            "backend_evidence": [] if report.job.backend else report.job.backend_evidence,
        }
    )


def bound_report(
    report: StacksReport, max_bytes: int = 7_000, full_ranks: list[int] | None = None
) -> StacksReport:
    """The report an MCP client gets by default: groups, suspects, differing frames, bounded.

    Per-rank stacks are kept only for ``full_ranks``; suspects keep their op and call site
    without threads. ``truncated`` and ``hint`` say how to get the rest.
    """
    wanted = set(full_ranks or [])
    suspects = set(report.verdict.suspect_ranks)
    stacks = [
        s if s.rank in wanted else _stub(s, report.groups, report.job.backend)
        for s in report.stacks
        if s.rank in wanted or s.rank in suspects
    ]
    job = _bounded_job(report, wanted, suspects)
    errors = report.errors[:_MAX_ERRORS]
    left = len(report.errors) - len(errors)
    shown = sorted(r for r in wanted if any(s.rank == r for s in report.stacks))
    more = "last=true, full_ranks=[N, ...] (CLI: rankscope stacks --last --show-rank N)"
    hint = (
        f"Full stacks of ranks {rank_ranges(shown)} are in `stacks`; the other ranks' in this capture: {more}."
        if shown
        else f"Per-rank stacks of this capture: {more}."
    )
    if left:
        hint += f" {left} more capture errors were left out."
    if len(report.groups) > _MAX_GROUPS or len(report.stack_groups) > _MAX_GROUPS:
        hint += f" Only the {_MAX_GROUPS} largest groups are listed."
    hang = report.verdict.kind not in PROGRESS_KINDS
    progress = _bounded_motions(report.progress, suspects, hang)
    if (
        not hang
        and progress is not None
        and report.progress is not None
        and len(progress.ranks) < len(report.progress.ranks)
    ):
        hint += (
            " progress.ranks is cut to the suspects (the evidence sums up every rank); last=true, full=true "
            "(CLI: rankscope stacks --last --full) has all."
        )
    out = report
    for limit in _FRAME_STEPS:
        out = report.model_copy(
            update={
                "job": job,
                "groups": _bounded_groups(report.groups, limit),
                "stack_groups": _bounded_groups(_new_splits(report), limit),
                "stacks": stacks,
                "errors": errors,
                "truncated": True,
                "hint": hint,
                "progress": progress,
            }
        )
        if size_of(compact(out)) <= max_bytes:
            return out
    # Still too big (thousands of distinct groups): drop the display groups, keep the op groups.
    return out.model_copy(update={"stack_groups": [], "hint": hint + " Whole-stack groups were left out."})


_MAX_PROGRESS_RANKS = 8


def _bounded_motions(progress: Progress | None, suspects: set[int], hang: bool) -> Progress | None:
    """The window's per-rank motions of the suspects (and the straggler) only: the verdict's
    evidence already gives every rank's in one line each, and 64 ranks' motions are kilobytes. A
    hang keeps none: nothing moved, and the summary says so for every rank."""
    if progress is None:
        return None
    keep = set() if hang else suspects | ({progress.straggler} if progress.straggler is not None else set())
    ranks = [r for r in progress.ranks if r.rank in keep][:_MAX_PROGRESS_RANKS]
    return progress if len(ranks) == len(progress.ranks) else progress.model_copy(update={"ranks": ranks})


_MAX_BRIEF_RANKS = 64
"""Ranks a brief job lists each (rank, local rank, pid, state, where the rank came from); the rest counted."""


def brief_jobs(jobs: JobList) -> JobList:
    """Every job, and every rank of it on one line as the plain view lists it (rank, local rank, pid,
    state, where the rank number came from), the first with its command line; ranks past
    :data:`_MAX_BRIEF_RANKS` summed up in a note (``details=True`` lists them all)."""
    out = []
    for job in jobs.jobs:
        listed = [
            r.model_copy(update={"cmdline": r.cmdline[:8] if i == 0 else [], "python": None})
            for i, r in enumerate(job.ranks[:_MAX_BRIEF_RANKS])
        ]
        notes = job.notes
        rest = job.ranks[_MAX_BRIEF_RANKS:]
        if rest:
            ranks = sorted(r.rank for r in rest if r.rank is not None)
            notes = [
                *notes,
                f"{len(rest)} more rank process(es) here: ranks {rank_ranges(ranks) or '?'}; "
                "list_jobs(details=true) (CLI: rankscope ps) lists each",
            ]
        out.append(job.model_copy(update={"ranks": listed, "notes": notes}))
    return jobs.model_copy(update={"jobs": out})


def _entry_signature(entry: FrEntry) -> tuple[object, ...]:
    site = entry.call_site
    return (
        entry.process_group,
        entry.op,
        str(entry.input_sizes),
        str(entry.output_sizes),
        str(entry.input_dtypes),
        str(entry.output_dtypes),
        entry.state,
        (site.file, site.line) if site else None,
    )


def _bounded_mismatch(m: FrMismatch, notes: list[str]) -> FrMismatch:
    """One entry per distinct record (op, sizes, dtypes, state, call site); recorded stacks only for
    the suspects' entries."""
    kept: dict[tuple[object, ...], FrEntry] = {}
    sharing: dict[tuple[object, ...], list[int]] = {}
    for entry in m.entries:
        sig = _entry_signature(entry)
        sharing.setdefault(sig, []).append(entry.rank)
        if sig not in kept:
            keep_frames = entry.rank in m.suspect_ranks
            kept[sig] = entry if keep_frames else entry.model_copy(update={"frames": []})
    if len(kept) < len(m.entries):
        same = [f"ranks {rank_ranges(r)} as rank {r[0]}" for r in sharing.values() if len(r) > 1]
        notes.append(
            f"first_mismatch.entries: one per distinct record ({'; '.join(same)}); full=true lists each rank"
        )
    return m.model_copy(update={"entries": list(kept.values())})


def _bounded_progress(group: FrProcessGroup, notes: list[str]) -> list[FrRankProgress]:
    """The ranks whose progress differs from most ranks', and one rank for the rest."""
    if len(group.progress) <= 2:
        return group.progress
    keys = [(p.last_entered, p.last_completed, p.pending_op, p.pending_p2p) for p in group.progress]
    common = max(set(keys), key=keys.count)
    odd = [p for p, k in zip(group.progress, keys, strict=True) if k != common]
    typical = next(p for p, k in zip(group.progress, keys, strict=True) if k == common)
    notes.append(
        f"process_groups[{group.name}].progress: {keys.count(common)} ranks as rank {typical.rank}, "
        f"the {len(odd)} that differ listed; full=true lists each rank"
    )
    return [typical, *odd]


def bound_flight(report: FlightReport) -> FlightReport:
    """The flight-recorder answer without repeats: the first mismatch once (not again in its
    process group), identical entries once, and per-rank progress only where ranks differ."""
    notes: list[str] = []
    first = _bounded_mismatch(report.first_mismatch, notes) if report.first_mismatch else None
    groups = []
    for g in report.process_groups:
        update: dict[str, object] = {"progress": _bounded_progress(g, notes)}
        if (
            g.first_mismatch is not None
            and report.first_mismatch is not None
            and g.first_mismatch == report.first_mismatch
        ):
            update["first_mismatch"] = None  # it is the report's first_mismatch
        elif g.first_mismatch is not None:
            update["first_mismatch"] = _bounded_mismatch(g.first_mismatch, [])
        groups.append(g.model_copy(update=update))
    return report.model_copy(
        update={
            "dumps": _bounded_dumps(report, notes),
            "dumps_read": len(report.dumps) if len(report.dumps) > 1 else None,
            "first_mismatch": first,
            "process_groups": groups,
            "left_out": [*report.left_out, *notes],
        }
    )


def _bounded_dumps(report: FlightReport, notes: list[str]) -> list[FrDump]:
    """The first dump read, and any that needed a repair; the others counted."""
    if len(report.dumps) <= 1:
        return report.dumps
    kept = [d for i, d in enumerate(report.dumps) if i == 0 or d.repaired]
    seen: set[tuple[str, ...]] = set()
    out = []
    for d in kept:  # one dump per kind of repair
        if tuple(d.repaired) not in seen or d is report.dumps[0]:
            out.append(d)
            seen.add(tuple(d.repaired))
    folders = sorted({d.path.rsplit("/", 1)[0] for d in report.dumps})
    notes.append(
        f"dumps: {len(report.dumps)} files read (ranks {rank_ranges(sorted({d.rank for d in report.dumps}))}) "
        f"in {', '.join(folders[:3])}{' ...' if len(folders) > 3 else ''}; {len(out)} listed; full=true lists each"
    )
    return out


def brief_templates(listed: TemplateList) -> TemplateList:
    """Each template by name, symptom and its own parameters with their defaults. Descriptions and
    ranges are for choosing among close ones (``full``), generate_repro validates what it is given,
    and the parameters every template takes are named once."""
    if not listed.templates:
        return listed
    shared = set.intersection(*({p.name for p in t.params} for t in listed.templates))
    brief = [
        t.model_copy(
            update={
                "description": "",
                "fixed_description": "",
                "failure_class": "",
                "skill_section": "",
                "params": [
                    p.model_copy(update={"help": "", "min": None, "max": None, "choices": None})
                    for p in t.params
                    if p.name not in shared
                ],
            }
        )
        for t in listed.templates
    ]
    notes = ["descriptions, playbook sections and parameter ranges: full=true (CLI: --full)"]
    if shared:
        notes.append("parameters every template takes: " + ", ".join(sorted(shared)))
    return listed.model_copy(update={"templates": brief, "left_out": [*listed.left_out, *notes]})


_EXCERPT_LINES = 1
_EXCERPT_CHARS = 240


_GLOG_PREFIX = re.compile(r"^\[[EWIF]\d{4} [\d:.]+ [\w.]+:\d+\] ")
"""c10's log prefix (``[E1126 09:11:05.100007919 ProcessGroupNCCL.cpp:757] ``): line_numbers say where."""


def _short_excerpt(text: str) -> str:
    lines = [_GLOG_PREFIX.sub("", line) for line in text.splitlines()[:_EXCERPT_LINES]]
    return "\n".join(
        line if len(line) <= _EXCERPT_CHARS else line[:_EXCERPT_CHARS] + " [...]" for line in lines
    )


_BIG_FACT = 300
"""Bytes above which a finding's fact is left out of a bounded triage (named in left_out)."""

_PER_KIND = 2
"""Findings of one kind kept in a bounded triage (the suspects' first); the rest are counted."""


_SUSPECT_FINDINGS = 8


def _aborted(f: Finding, report: TriageReport) -> bool:
    """A kill the watchdog or the launcher dealt after a timeout: its explanation is not the story."""
    signal = f.facts.get("signal") if f.kind == "killed_by_signal" else None
    return signal in ("SIGTERM", "SIGINT") or (signal == "SIGABRT" and "collective_timeout" in report.kinds)


def _kept_findings(report: TriageReport, notes: list[str]) -> list[Finding]:
    """Per kind, every finding about a suspect (up to 8) and at least one about another rank: the
    suspects' findings and the contrast that made them suspects are never cut; repeats are (and
    kills that are all consequences, and dump-signal lines that repeat a timeout's counts)."""
    suspects = set(report.suspect_ranks)
    timed_out = {r for f in report.findings if f.kind == "collective_timeout" for r in f.ranks}
    by_kind: dict[str, list[Finding]] = {}
    for f in report.findings:
        if f.kind == "fr_dump_signal" and set(f.ranks) <= timed_out and f.ranks and f.kind in by_kind:
            continue  # the same counts as the rank's own timeout finding: one shows the kind
        by_kind.setdefault(f.kind, []).append(f)
    repeated = sum(1 for f in report.findings if f.kind == "fr_dump_signal") - len(
        by_kind.get("fr_dump_signal", [])
    )
    if repeated:
        notes.append(
            f"{repeated} fr_dump_signal findings of ranks that timed out (counts as theirs): full=true"
        )
    keep: set[int] = set()
    for kind, found in by_kind.items():
        theirs = [f for f in found if set(f.ranks) & suspects][:_SUSPECT_FINDINGS]
        others = [f for f in found if not set(f.ranks) & suspects]
        contrast = 0 if theirs and found[0].severity == "info" else max(1, _PER_KIND - len(theirs))
        kept = theirs + others[:contrast]
        if all(_aborted(f, report) for f in found):
            kept = kept[:1]  # every one a consequence: one says it for all
        keep.update(id(f) for f in kept)
        rest = [f for f in found if id(f) not in keep]
        if rest:
            ranks = sorted({r for f in rest for r in f.ranks})
            notes.append(f"{len(rest)} more {kind} findings (ranks {rank_ranges(ranks) or '?'}): full=true")
    return [f for f in report.findings if id(f) in keep]


def _told_by_story(report: TriageReport, notes: list[str]) -> TriageReport:
    """A dead job whose summary tells who waited where and who did not: a silent rank's code read
    (``report.blocking_calls``) or a watch's capture (``decided_by="watch"``). One timeout stays as
    the log's evidence; the other timeouts, the launcher's table and SIGTERMs, the logs' evidence
    lines (the capture's stay) and the steps after the first two go to full=true."""
    first = next((f for f in report.findings if f.kind == "collective_timeout"), None)
    kept = [
        f
        for f in report.findings
        if f is first
        or (
            f.kind not in ("collective_timeout", "child_failed")
            and not (f.kind == "killed_by_signal" and f.facts.get("sent_by_launcher"))
        )
    ]
    notes.append("the other timeouts, the launcher's findings, evidence, more steps: full=true")
    watched = report.decided_by == "watch"
    return report.model_copy(
        update={
            "findings": kept,
            "failures": [],
            "evidence": report.evidence if watched else [],
            "next_steps": report.next_steps[: 2 if watched else 1],
        }
    )


def _relative_sources(report: TriageReport) -> TriageReport:
    """The sources' paths relative to the folder that holds them all (``rank3.log``,
    ``attempt_0/3/error.json``): the caller named that folder, and the answer's size does not
    depend on where it is. A finding's source follows its file."""
    paths = [s.path for s in report.sources if s.path.startswith("/")]
    if not paths:
        return report
    folder = posixpath.commonpath([posixpath.dirname(p) for p in paths]).rstrip("/") + "/"
    short = {p: p[len(folder) :] for p in paths if p.startswith(folder)}
    return report.model_copy(
        update={
            "sources": [s.model_copy(update={"path": short.get(s.path, s.path)}) for s in report.sources],
            "findings": [
                f.model_copy(update={"source": short[f.source]}) if f.source in short else f
                for f in report.findings
            ],
        }
    )


def bound_triage(report: TriageReport) -> TriageReport:
    """Triage without repeats: at most two findings per kind (the suspects' first), a kind's
    explanation, fix and next steps once, excerpts cut to their first lines, torchrun's failure
    records of the first observed failure and the suspects only, and the sources' paths relative
    to their folder."""
    report = _relative_sources(report)
    notes: list[str] = []
    if report.blocking_calls or report.decided_by == "watch":
        report = _told_by_story(report, notes)
    suspects = set(report.suspect_ranks)
    kept = _kept_findings(report, notes)
    detailed: dict[str, int] = {}  # per kind, the finding that keeps its explanation: a suspect's first
    for f in kept:
        if f.severity == "info" or _aborted(f, report) or (f.kind == "child_failed" and detailed):
            continue
        if not suspects or set(f.ranks) & suspects:
            detailed.setdefault(f.kind, id(f))
    one_source = len(report.sources) == 1 and all(f.source == report.sources[0].path for f in kept)
    if one_source and kept:
        notes.append("findings[].source: sources[0].path")
    out = []
    for f in kept:
        update: dict[str, object] = {}
        if detailed.get(f.kind) != id(f):  # source and line_numbers say where to read it
            update.update({"explanation": "", "fix": "", "next_steps": [], "excerpt": ""})
            if "call_site" in f.facts and not set(f.ranks) & suspects:
                update["facts"] = {k: v for k, v in f.facts.items() if k != "call_site"}
        else:
            if _short_excerpt(f.excerpt) != f.excerpt:
                update["excerpt"] = _short_excerpt(f.excerpt)
            if f.next_steps and all(s in report.next_steps for s in f.next_steps):
                update["next_steps"] = []  # the answer's own next_steps hold them
        if one_source:
            update["source"] = None
        facts = cast("dict[str, Any]", update.get("facts", f.facts))
        if "pg_guid" in facts and "pg_id" in facts:  # the group's id names it; the guid repeats it
            facts = update["facts"] = {k: v for k, v in facts.items() if k != "pg_guid"}
        big = [k for k, v in facts.items() if size_of(v) > _BIG_FACT]
        if big:  # e.g. a copy of torchrun's failure table, which `failures` holds once
            update["facts"] = {k: v for k, v in facts.items() if k not in big}
            notes.append(f"{f.kind} facts {', '.join(big)}: full=true")
        out.append(f.model_copy(update=update) if update else f)
    if any(a is not b for a, b in zip(out, report.findings, strict=False)) or len(out) < len(report.findings):
        notes.append("explanations, fixes and excerpts beyond one per kind about the suspects: full=true")
    failures = [
        x.model_copy(
            update={
                "message": "" if x.message.startswith(("To enable traceback", "Signal ")) else x.message,
                "error_file": None if x.error_file == "<N/A>" else x.error_file,
            }
        )
        for x in report.failures
        if x.first_observed or x.rank in suspects
    ]  # torchrun's boilerplate says nothing
    if len(failures) < len(report.failures):
        notes.append(f"{len(report.failures) - len(failures)} more torchrun failure records: full=true")
    lead = {"flight_recorder": "flight", "stacks": "stacks"}.get(report.decided_by or "")
    verdicts: dict[str, object] = {}
    if lead and getattr(report, lead) is not None:  # its evidence and steps are the answer's own, above
        verdicts[lead] = getattr(report, lead).model_copy(update={"evidence": [], "next_steps": []})
        notes.append(f"{lead}.evidence and {lead}.next_steps: in evidence and next_steps above")
    if not notes:
        return report
    return report.model_copy(
        update={
            "findings": out,
            "failures": failures,
            "evidence": merge_rank_lines(report.evidence),
            "stats": {},
            "left_out": [*report.left_out, *notes],
            **verdicts,
        }
    )


def bound_env(report: EnvReport) -> EnvReport:
    """Every rank's environment once: the first rank's in full, the others' only where they differ
    (``differences`` names each variable that does, with every rank's value)."""
    if len(report.ranks) <= 1:
        return report
    first = report.ranks[0]
    others = [
        r.model_copy(
            update={
                "env": {},
                "python": r.python if r.python != first.python else None,
                "torch_version": r.torch_version if r.torch_version != first.torch_version else None,
                "torch_path": r.torch_path if r.torch_path != first.torch_path else None,
                "limits": r.limits if r.limits != first.limits else None,
            }
        )
        for r in report.ranks[1:]
    ]
    job = report.job
    if job is not None and len(job.ranks) > 1:
        job = job.model_copy(update={"ranks": [job.ranks[0], *(_slim_rank(r) for r in job.ranks[1:])]})
    note = (
        f"ranks[1:]: the environment, interpreter and limits of ranks[0] except what differences lists "
        f"({len(report.ranks) - 1} ranks); full=true lists each"
    )
    return report.model_copy(
        update={"ranks": [first, *others], "job": job, "left_out": [*report.left_out, note]}
    )
