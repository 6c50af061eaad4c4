"""Lines for a person: the text view of `rankscope triage` (typed on its model; pure)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from rankscope.analysis.ranges import rank_ranges
from rankscope.models.core import Finding
from rankscope.models.logs import TriageReport
from rankscope.render.next_steps import brief_next_steps, render_next_steps


def render_triage(r: TriageReport) -> Iterator[str]:
    """Human view: summary and suspects first, then one block per finding."""
    read = ", ".join(
        f"{s.path}" + (f" (rank {s.rank_hint})" if s.rank_hint is not None else "") for s in r.sources
    )
    yield f"Read: {read}  [{r.stats.get('lines', 0)} lines, {r.stats.get('bytes', 0)} bytes]"
    for s in r.sources:
        if s.skipped:
            yield f"  skipped {s.path}: {s.skipped}"
    yield ""
    yield f"Summary: {r.summary}"
    if r.decided_by:
        yield f"Decided by: {r.decided_by.replace('_', ' ')}"
    yield f"Suspect ranks: {', '.join(map(str, r.suspect_ranks)) or '-'}    Victims: {', '.join(map(str, r.victim_ranks)) or '-'}"
    for e in r.evidence:
        yield f"  - {e}"
    for line in r.watch or []:
        yield f"Watch: {line}"
    if r.blocking_calls:
        yield "Blocking calls on the silent ranks' way to the collective (read from the code, not a stack):"
        yield from (f"  {line}" for line in r.blocking_calls)
    if r.findings:
        yield ""
        yield f"Findings ({', '.join(f'{k}: {n}' for k, n in r.kinds.items())}):"
    fixes_said: set[str] = set()
    for f in r.findings:
        ranks = f"ranks {','.join(map(str, f.ranks))}" if f.ranks else "no rank"
        where = f"{f.source}:{','.join(map(str, f.line_numbers[:4]))}" if f.source else ""
        yield f"[{f.severity.upper()}] {f.kind} ({ranks}) {f.message}  @ {where}"
        facts = {k: v for k, v in f.facts.items() if k != "failures"}
        if facts:
            yield "    facts: " + ", ".join(f"{k}={v}" for k, v in facts.items())
        for line in f.excerpt.splitlines()[:2]:
            yield f"    | {line[:200]}"
        if f.fix:
            yield "    fix: as above" if f.fix in fixes_said else f"    fix: {f.fix}"
            fixes_said.add(f.fix)
    if r.truncated:
        yield f"... {r.dropped_findings} more findings left out (use --max-findings)."
    for name, verdict in (("Flight recorder", r.flight), ("Saved stacks", r.stacks)):
        if verdict is not None:
            suspects = ", ".join(map(str, verdict.suspect_ranks)) or "-"
            yield ""
            yield f"{name}: {verdict.kind}  suspects: {suspects}"
    yield from render_next_steps(r.next_steps)
    if r.playbook:
        yield f"Read next: {r.playbook}"


def _read_line(r: TriageReport) -> str:
    """``read: 5 files in DIR/: torchrun.log, py-spy_rank0.txt, ...``: each folder spelled out once."""
    paths = [s.path for s in r.sources if not s.skipped]
    more = f" (+{len(paths) - MAX_NAMED_FILES} more)" if len(paths) > MAX_NAMED_FILES else ""
    top = _common_folder(paths)
    if top:
        names = ", ".join(os.path.relpath(p, top) for p in paths[:MAX_NAMED_FILES])
        line = f"read: {len(paths)} files in {top}/: {names}{more}"
    else:
        line = "read: " + ", ".join(paths[:MAX_NAMED_FILES]) + more
    skipped = [s for s in r.sources if s.skipped]
    if skipped:
        line += f"; skipped {len(skipped)}: " + "; ".join(f"{s.path}: {s.skipped}" for s in skipped[:3])
    return line


MAX_NAMED_FILES = 8


def _common_folder(paths: list[str]) -> str:
    """The folder several files share ("" for one file, or for paths with nothing in common)."""
    if len(paths) < 2 or len({os.path.isabs(p) for p in paths}) != 1:
        return ""
    top = os.path.commonpath(paths)
    return "" if top in ("", "/") else top


def _finding_brief(f: Finding, said: str, first_of_kind: Finding | None) -> Iterator[str]:
    """A finding in the lines a model needs: who, where to read it, and what is not said above."""
    who = f"rank{'s' if len(f.ranks) > 1 else ''} {rank_ranges(f.ranks)}" if f.ranks else "no rank"
    lines = ",".join(map(str, f.line_numbers[:4]))
    where = (f" at {f.source}:{lines}" if f.source else f" at line(s) {lines}") if lines else ""
    message = "" if f.message in said else f": {f.message}"
    yield f"{f.kind} ({who}){where}{message}"
    facts = {  # a finding without its fix is a repeat of its kind: where to read it is enough
        k: v
        for k, v in f.facts.items()
        if k != "failures"
        and (f.fix or f.explanation)
        and (first_of_kind is None or first_of_kind.facts.get(k) != v)
    }
    if facts:
        yield "   " + ", ".join(f"{k}={v}" for k, v in facts.items())
    excerpt = f.excerpt.splitlines()[0][:200] if f.excerpt else ""
    if excerpt and excerpt not in said:
        yield f"   | {excerpt}"
    if f.fix and f.fix not in said:
        yield f"   fix: {f.fix}"


def render_triage_brief(r: TriageReport) -> Iterator[str]:
    """The view a model reads: the verdict (the summary) first, each fact once, where to read more.

    Evidence the summary quotes, a finding's message the evidence gave, the facts a second finding
    of a kind shares with the first, a playbook a next step already names: all left out.
    """
    yield f"verdict: {r.summary or 'no known failure pattern'}"
    who = [
        f"suspects: {rank_ranges(r.suspect_ranks) or '-'}",
        f"victims: {rank_ranges(r.victim_ranks)}" if r.victim_ranks else "",
        f"decided by: {r.decided_by.replace('_', ' ')}" if r.decided_by else "",
    ]
    yield "; ".join(x for x in who if x)
    yield _read_line(r)
    yield from (f"watch: {line}" for line in r.watch or [])
    yield from (f"- {line}" for line in r.blocking_calls or [])
    said = r.summary
    for e in r.evidence:
        if e.split(": ", 1)[-1] not in said:
            yield f"- {e}"
            said += "\n" + e
    firsts: dict[str, Finding] = {}
    for f in r.findings:
        lines = list(_finding_brief(f, said, firsts.get(f.kind)))
        firsts.setdefault(f.kind, f)
        said += "\n" + "\n".join(lines)
        yield from lines
    if r.truncated:
        yield f"{r.dropped_findings} more findings left out (max_findings)"
    for name, verdict in (("recorder", r.flight), ("saved stacks", r.stacks)):
        if verdict is not None and verdict.summary and verdict.summary not in said:
            yield f"{name}: {verdict.kind}, suspects {rank_ranges(verdict.suspect_ranks) or '-'}"
    yield from brief_next_steps(r.next_steps)
    if r.playbook and not any(s.skill_section == r.playbook for s in r.next_steps):
        yield f"read next: {r.playbook}"
