"""The findings a log scan accumulates: one per (kind, rank, source), however many lines repeat it.

A log repeats itself (every step prints the same warning, every rank the same timeout): one finding
per (kind, rank, source) with a count and the first few lines keeps the answer small while still
saying how often. What a line (or a failure record) says comes in as a ``Draft``; the most severe
wording seen wins, the facts seen first stay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rankscope.analysis.triage.log_rules import Role
from rankscope.models.core import Finding, NextStep, Severity

SEVERITY_ORDER: dict[str, int] = {"critical": 0, "error": 1, "warning": 2, "info": 3}
ROLE_ORDER: dict[str, int] = {"cause": 0, "context": 1, "victim": 2}
MAX_LINES_PER_FINDING = 8
"""Line numbers kept per finding: enough to find it in the log, not every repeat."""
EXCERPT_CHARS = 600
"""Characters of the log kept per finding (and per launcher message): the answer stays small."""

Key = tuple[str, int | None, str]
"""(kind, rank, source): what one accumulated finding stands for."""


@dataclass
class Draft:
    """What one line or one failure record says about a finding, before it joins the others."""

    kind: str
    severity: Severity
    role: Role
    message: str
    explanation: str
    fix: str
    next_steps: list[NextStep]
    facts: dict[str, Any]


@dataclass
class Acc:
    """A finding being accumulated from one or more lines."""

    kind: str
    severity: Severity
    role: Role
    rank: int | None
    source: str
    message: str
    explanation: str
    fix: str
    next_steps: list[NextStep]
    first_line: int
    order: int
    lines: list[int] = field(default_factory=list)
    excerpt: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    count: int = 0


class Accumulator:
    """One ``Acc`` per (kind, rank, source), in the order first seen; ``findings`` ranks them."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        self._redact = redact
        self.by_key: dict[Key, Acc] = {}
        """Every finding so far; the passes after the scan fold and re-rank them in place."""
        self._order = 0

    def add(self, draft: Draft, rank: int | None, source: str, line_no: int, text: str) -> None:
        """Join ``draft`` to its finding (a new one on first sight): a more severe wording replaces the
        old one, facts already known stay, and only the first lines and characters are kept."""
        key = (draft.kind, rank, source)
        acc = self.by_key.get(key)
        if acc is None:
            self._order += 1
            acc = Acc(
                kind=draft.kind,
                severity=draft.severity,
                role=draft.role,
                rank=rank,
                source=source,
                message=draft.message,
                explanation=draft.explanation,
                fix=draft.fix,
                next_steps=draft.next_steps,
                first_line=line_no,
                order=self._order,
            )
            self.by_key[key] = acc
        elif SEVERITY_ORDER[draft.severity] < SEVERITY_ORDER[acc.severity]:
            acc.severity, acc.explanation, acc.fix = draft.severity, draft.explanation, draft.fix
            acc.message = draft.message
        acc.count += 1
        for k, v in draft.facts.items():
            acc.facts.setdefault(k, v)
        if len(acc.lines) < MAX_LINES_PER_FINDING:
            acc.lines.append(line_no)
            if sum(len(e) for e in acc.excerpt) < EXCERPT_CHARS:
                acc.excerpt.append(self._redact(text.strip())[:EXCERPT_CHARS])

    def findings(self) -> list[Finding]:
        """The findings, causes before context before victims, then by severity, then first seen."""
        accs = sorted(
            self.by_key.values(), key=lambda a: (ROLE_ORDER[a.role], SEVERITY_ORDER[a.severity], a.order)
        )
        return [_finding(a) for a in accs]


def _finding(a: Acc) -> Finding:
    """The answer's form of one accumulated finding; a repeated one says how often."""
    facts = dict(a.facts)
    if a.count > 1:
        facts["occurrences"] = a.count
    return Finding(
        kind=a.kind,
        severity=a.severity,
        ranks=[a.rank] if a.rank is not None else [],
        message=a.message,
        explanation=a.explanation,
        fix=a.fix,
        source=a.source,
        line_numbers=a.lines,
        excerpt="\n".join(a.excerpt),
        facts=facts,
        next_steps=a.next_steps,
    )
