"""The hang verdict: the facts of one capture in, one :class:`Verdict` out.

Where its parts live:

- analysis/hang/verdict_facts.py: :class:`Facts` (the ranks sorted by what they wait for) and
  :class:`Ruling` (what a rule answers);
- analysis/hang/verdict_rules.py: the rules common to both backends, the tie-breaks, and the two
  ordered tables (``NCCL_RULES``, ``GLOO_RULES``); analysis/hang/verdict_nccl.py and
  analysis/hang/verdict_mismatch.py: the NCCL rules and the mismatched-collectives rule;
- analysis/hang/verdict_texts.py: the words: every sentence and next step, by key, with each step's
  tool arguments as data; analysis/hang/verdict_phrases.py and analysis/hang/verdict_evidence.py: how
  groups, partings and guards are named, and the evidence lines every verdict carries.
"""

from __future__ import annotations

import dataclasses

from rankscope.analysis.hang.verdict_evidence import BACKWARD_OP, evidence
from rankscope.analysis.hang.verdict_facts import Facts, Ruling
from rankscope.analysis.hang.verdict_locks import with_lock_cycle
from rankscope.analysis.hang.verdict_rules import GLOO_RULES, NCCL_RULES, rule_for
from rankscope.analysis.hang.verdict_texts import RAN_OUT_EARLY, next_steps
from rankscope.models.core import Verdict


def with_evidence(f: Facts) -> Facts:
    """The facts of one capture (``verdict_facts.sort_ranks``) with the evidence every verdict
    carries. Added here, not in verdict_facts, so that the facts, the phrases and the evidence
    import in one direction."""
    f.evidence = evidence(f)
    return f


def decide(f: Facts) -> Verdict:
    """The first rule of the backend's table that matches (the last word when none does), in words."""
    return verdict(_without_echo(with_lock_cycle(rule_for(f), f), f))


def _without_echo(ruling: Ruling, f: Facts) -> Ruling:
    """A sure ruling without the counters' line when that line only names its suspects again: it
    decides nothing and costs the reader bytes. It stays where the verdict is unsure, where the
    counters name others, and where they decided (their split is in the summary)."""
    split = f.counters
    if split is None or ruling.confidence != "high" or split.suspects != sorted(ruling.suspects):
        return ruling
    if split.evidence.split(": ", 1)[-1] in ruling.summary:
        return ruling
    return dataclasses.replace(ruling, evidence=[e for e in ruling.evidence if e != split.evidence])


def verdict(ruling: Ruling) -> Verdict:
    """A ruling as the answer gives it: its next steps in words, each call with its arguments."""
    return Verdict(
        kind=ruling.kind,
        suspect_ranks=ruling.suspects,
        confidence=ruling.confidence,
        summary=ruling.summary,
        evidence=ruling.evidence,
        next_steps=next_steps(ruling.steps, ruling.suspects),
    )


__all__ = [
    "BACKWARD_OP",
    "GLOO_RULES",
    "NCCL_RULES",
    "RAN_OUT_EARLY",
    "Facts",
    "Ruling",
    "decide",
    "verdict",
    "with_evidence",
]
