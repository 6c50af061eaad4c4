"""Lines for a person: the text view of `rankscope triage` (typed on its model; pure)."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.models.logs import TriageReport
from rankscope.render.next_steps import render_next_steps


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
