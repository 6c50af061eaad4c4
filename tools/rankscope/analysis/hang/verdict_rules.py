"""The hang rules: two tables, read one rule at a time, first match wins.

A rule takes the facts of one capture (:class:`~rankscope.analysis.hang.verdict_facts.Facts`) and
returns a :class:`~rankscope.analysis.hang.verdict_facts.Ruling` or None; its sentences and next
steps are keys into analysis/hang/verdict_texts.py. The gloo rules assume what gloo does: a
collective blocks the CPU until every rank arrives, so where the CPU stops is where the rank
is stuck. The NCCL rules (analysis/hang/verdict_nccl.py) know that a collective returns once its
kernel is enqueued. A tie-break is a rule too: it sits just before the rule whose open answer
it breaks, and fires only when the progress counters give a lead that answer lacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rankscope.analysis.hang.counters import CounterSplit
from rankscope.analysis.hang.frames import main_thread, short_site
from rankscope.analysis.hang.verdict_facts import Facts, Ruling
from rankscope.analysis.hang.verdict_mismatch import library_fix, rule_mismatched
from rankscope.analysis.hang.verdict_nccl import (
    nccl_same_line,
    rule_flight_recorder,
    rule_gpu_idle,
    rule_nccl_cannot_tell,
    rule_nccl_library_call,
    rule_nccl_lone_collective,
    rule_nccl_rank_elsewhere,
    rule_ras,
)
from rankscope.analysis.hang.verdict_phrases import (
    are,
    describe,
    describe_all,
    guard_phrase,
    inside_phrase,
    lone_call,
    other_side,
    state_words,
    stopped_groups,
    transport,
)
from rankscope.analysis.hang.verdict_texts import Step, say, step
from rankscope.analysis.hang.waits import under_own_line
from rankscope.analysis.p2p import P2P_DIRECTION, cycle_phrase, find_cycle
from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.core import Confidence, Group

Rule = Callable[[Facts], Ruling | None]
"""A rule: the facts of one capture in, a ruling out, or None when it does not apply."""


def rule_nothing_captured(f: Facts) -> Ruling | None:
    """No stack at all: say why and what to fix, name no one."""
    if f.live or f.stuck:
        return None
    errors = say("capture_errors", n=len(f.errors), kind=f.errors[0].kind) if f.errors else ""
    return Ruling(
        kind="inconclusive",
        suspects=[],
        confidence="low",
        summary=say("nothing_captured") + errors,
        evidence=f.evidence,
        steps=(step("fix_capture"), step("job_alive"), step("logs_if_dead")),
    )


def rule_counters(f: Facts) -> Ruling | None:
    """A rank whose progress counter (step, epoch, i) differs from the majority's left the common path.

    Only a clear split decides here: a known counter name, one odd value, a minority. Other
    integers that disagree (a batch's token count) may differ by design; they go in the
    evidence and break the ties the CPU positions leave open (the ``tie_`` rules).
    """
    split = f.counters
    if split is None or not split.suspects or split.confidence != "high":
        return None  # a weaker split (an unnamed integer, several odd values) only breaks ties
    return Ruling(
        kind="divergent_ranks",
        suspects=split.suspects,
        confidence=split.confidence,
        summary=say(
            "counters",
            split=split.summary,
            who=ranks_phrase(split.suspects),
            gpu_note=say("counters_gpu_note") if f.gpu else "",
        ),
        evidence=f.evidence,
        steps=(step("read_counter_loop"), step("dump_native_counters"), step("repro_divergent")),
    )


def rule_divergent(f: Facts) -> Ruling | None:
    """Ranks in no collective (or stopped) while their peers wait in one: they never reached it."""
    if not (f.in_coll and (f.idle or f.stuck)):
        return None
    suspects = sorted({s.rank for s in [*f.idle, *f.stuck] if s.rank is not None})
    parts = [*stopped_groups(f), *(describe(g) for g in f.none_groups)]
    summary = say(
        "divergent", parts="; ".join(parts), waiting=describe_all(f.op_groups), who=ranks_phrase(suspects)
    )
    conditions = [p for g in f.none_groups if (p := guard_phrase(f, g))]
    inside = [(g, call) for g in f.none_groups if (call := lone_call(f, g)) is not None]
    for g, call in inside:  # in no collective frame, but inside a library call that is one
        summary += "; " + inside_phrase(f, g.ranks, call)
    if conditions:
        summary += f"; {'; '.join(conditions)}"
    if f.gpu:
        summary += say("cpu_not_where_stuck", groups=describe_all(f.gpu_groups))
    confidence: Confidence = "high" if f.stuck or not f.nccl else "medium"
    unread = _in_c_under_own_line(f, suspects)
    if unread:
        confidence = "medium"
        summary += say("backend_unknown_in_c", who=ranks_phrase(unread), are=are(len(unread)))
    steps: list[Step] = []
    if f.stuck:
        steps.append(step("resume_stuck", who=ranks_phrase([s.rank for s in f.stuck if s.rank is not None])))
    fix = library_fix(f, suspects, any_wait=True) if inside else None
    if f.idle:
        steps += [*([fix] if fix else []), step("read_divergent_sites"), step("dump_native_locals_divergent")]
    steps.append(step("repro_divergent"))
    return Ruling("divergent_ranks", suspects, confidence, summary, f.evidence, tuple(steps))


def _in_c_under_own_line(f: Facts, ranks: list[int]) -> list[int]:
    """Of ``ranks``, those read from Python frames alone whose innermost frame is the job's own line
    (so they are in C code called from it), when the backend is not known: on NCCL such a rank may
    be waiting for the GPU rather than be where it is stuck."""
    if f.backend not in (None, "unknown"):
        return []
    return sorted(
        s.rank
        for s in f.live
        if s.rank in ranks
        and s.wait == "other"
        and (thread := main_thread(s)) is not None
        and under_own_line(thread.frames) is not None
    )


def is_loopback(addr: str | None) -> bool:
    """MASTER_ADDR that only this host can reach: the job cannot span hosts."""
    return addr is not None and (addr.startswith("127.") or addr in ("localhost", "::1", "ip6-localhost"))


def rule_missing(f: Facts) -> Ruling | None:
    """Ranks of the world that exited are the suspects; ranks merely on another host are not.

    A rank that is not on this host cannot be blamed from here: the verdict says so, names no
    suspect for it, and its first step collects the other hosts. After a capture merged from
    several hosts, a rank found on none of them is a suspect (it exited or was never started).
    """
    if not (f.missing or f.exited):
        return None
    here = ranks_phrase(sorted({s.rank for s in f.live if s.rank is not None}))
    what = (
        describe(f.op_groups[0]) if f.op_groups else say("in_no_collective", who=here, are=are(len(f.live)))
    )
    away = sorted(set(f.missing) - set(f.exited))
    merged = len(f.job.hosts) > 1
    local_only = is_loopback(f.job.master_addr)
    blamed = sorted(set(f.exited) | (set(away) if merged or local_only else set()))
    parts = [say("exited", who=ranks_phrase(f.exited))] if f.exited else []
    if away and local_only:
        parts.append(say("not_found_loopback", who=ranks_phrase(away), addr=f.job.master_addr))
    elif away:
        where = "not_found_merged" if merged else "not_found_here"
        parts.append(say(where, who=ranks_phrase(away), hosts=len(f.job.hosts)))
    said = "; ".join(parts)
    if blamed:
        key = "missing_suspects" if len(blamed) > 1 else "missing_suspect"
        summary = say(key, what=what, parts=said, who=ranks_phrase(blamed))
    else:
        summary = say("missing_elsewhere", what=what, parts=said)
    steps = [step("collect_other_hosts")] if away else []
    if f.exited:
        steps.append(step("logs_exited"))
    steps.append(step("jobs_here"))
    confidence: Confidence = "high" if f.exited else ("medium" if blamed else "low")
    return Ruling("missing_ranks", blamed, confidence, summary, f.evidence, tuple(steps))


def rule_all_in_same(f: Facts) -> Ruling | None:
    """Every rank waits in the same collective at the same line: the ranks agree, the hang is elsewhere."""
    if len(f.op_groups) != 1 or f.idle:
        return None
    g = f.op_groups[0]
    if g.op in P2P_DIRECTION:
        return _all_in_same_p2p(f, g)
    if f.backend in ("nccl", "mixed"):
        return nccl_same_line(f, g)
    summary = say(
        "all_in_same",
        n=len(g.ranks),
        op=g.op,
        site=short_site(g.call_site),
        transport=transport(f.backend),
        or_gpu="" if f.on_gloo else say("or_a_gpu"),
    )
    recorder = () if f.on_gloo else (step("recorder_not_completed"),)
    steps = (step("other_hosts_too"), step("env_comm"), *recorder, step("logs_transport"))
    return Ruling("all_in_same_collective", [], "low", summary, f.evidence, steps)


def _all_in_same_p2p(f: Facts, g: Group) -> Ruling:
    """Every rank blocked in the same send (or recv) at the same line.

    Unlike a collective, this is rarely the transport: a blocking recv returns only when
    its peer sends, so when every rank receives, nobody sends, unless the sends were
    posted earlier with isend. The peers (``waits``, read from the calls' locals) turn that
    into a named cycle.
    """
    direction = P2P_DIRECTION[g.op or ""]
    cycle = find_cycle(f.waits)
    where = say("p2p_where", n=len(g.ranks), op=g.op, site=short_site(g.call_site))
    if cycle is not None:
        summary = f"{where}; {cycle_phrase(cycle, f.waits)}"
    else:
        other = other_side(direction)
        summary = say(
            "p2p_unmatched",
            where=where,
            others=f"{other}s",
            direction=direction,
            other=other,
            transport=transport(f.backend),
        )
    steps = [step("order_p2p")]
    if cycle is None and len(f.waits) < len(g.ranks):
        steps.append(step("dump_locals_p2p"))
    steps.append(step("env_if_isend"))
    if not f.on_gloo:
        steps.append(step("recorder_p2p"))
    steps.append(step("repro_p2p"))
    confidence: Confidence = "high" if cycle is not None else "medium"
    return Ruling("all_in_same_collective", [], confidence, summary, f.evidence, tuple(steps))


def rule_stopped(f: Facts) -> Ruling | None:
    """Only stopped ranks: the job is stopped, not hung in a collective."""
    if not f.stuck or f.live:
        return None
    suspects = sorted(s.rank for s in f.stuck if s.rank is not None)
    summary = say(
        "stopped",
        who=ranks_phrase(suspects),
        are=are(len(f.stuck)),
        states=", ".join(sorted({state_words(s.state) for s in f.stuck})),
    )
    return Ruling(
        "no_collective", suspects, "high", summary, f.evidence, (step("resume"), step("dump_when_running"))
    )


def rule_no_collective(f: Facts) -> Ruling:
    """No rank waits in a collective or for the GPU: the job is stuck (or slow) in its own code.
    The last word of both tables: it always answers."""
    summary = say(
        "no_collective",
        sites=describe_all(f.none_groups) or say("no_rank_in_collective"),
        hint="" if f.nccl or f.on_gloo else say("native_hint"),
    )
    steps = (step("dump_again_soon"), step("dump_native_main"), step("inspect_memory"))
    return Ruling("no_collective", [], "low", summary, f.evidence, steps)


# -- tie-breaks: what the CPU positions leave open, a weaker counter split may lead ----------------

_OPEN_KINDS = ("inconclusive", "all_in_same_collective", "no_collective")
"""Verdicts that may name no one: a counter split is then the only lead."""


def _weak_lead(f: Facts) -> CounterSplit | None:
    """A counter split that names someone while some rank runs: too weak to decide alone
    (:func:`rule_counters` takes the clear ones), enough to break a tie."""
    split = f.counters
    return split if split is not None and split.suspects and f.live else None


def _counters_decide(f: Facts, rule: Rule) -> Ruling | None:
    """``rule``'s low-confidence mismatch (an even split, a subgroup whose culprit is not named,
    a lone collective read from an unsure wait), decided by the counters at their confidence."""
    split = _weak_lead(f)
    ruling = rule(f) if split is not None else None
    if split is None or ruling is None or ruling.confidence != "low":
        return None
    if ruling.kind != "mismatched_collectives":
        return None
    summary = say("counters_decide", summary=ruling.summary, split=split.summary)
    return replace(ruling, suspects=split.suspects, confidence=split.confidence, summary=summary)


def _counters_lead(f: Facts, rule: Rule) -> Ruling | None:
    """``rule``'s answer that names no one, with the counters' suspects as a low-confidence lead
    (divergent ranks), its next steps kept and aimed at them."""
    split = _weak_lead(f)
    ruling = rule(f) if split is not None else None
    if split is None or ruling is None or ruling.confidence != "low":
        return None
    if ruling.kind not in _OPEN_KINDS or ruling.suspects:
        return None
    summary = say("counters_lead", summary=ruling.summary, split=split.summary)
    return replace(ruling, kind="divergent_ranks", suspects=split.suspects, summary=summary)


def tie_lone_collective(f: Facts) -> Ruling | None:
    """A lone collective read from an unsure wait: the counters decide who the suspects are."""
    return _counters_decide(f, rule_nccl_lone_collective)


def tie_mismatched(f: Facts) -> Ruling | None:
    """Ranks split between collectives with no one named for sure: the counters decide."""
    return _counters_decide(f, rule_mismatched)


def tie_cannot_tell(f: Facts) -> Ruling | None:
    """NCCL, every CPU at a GPU wait: the counters are the only lead."""
    return _counters_lead(f, rule_nccl_cannot_tell)


def tie_all_in_same(f: Facts) -> Ruling | None:
    """Every rank in the same collective at the same line: the counters are the only lead."""
    return _counters_lead(f, rule_all_in_same)


def tie_no_collective(f: Facts) -> Ruling | None:
    """No rank in a collective: the counters are the only lead."""
    return _counters_lead(f, rule_no_collective)


NCCL_RULES: tuple[Rule, ...] = (
    rule_nothing_captured,
    rule_flight_recorder,
    rule_ras,
    rule_nccl_library_call,
    rule_counters,
    rule_nccl_rank_elsewhere,
    rule_gpu_idle,
    tie_lone_collective,
    rule_nccl_lone_collective,
    rule_divergent,
    tie_mismatched,
    rule_mismatched,
    rule_missing,
    tie_cannot_tell,
    rule_nccl_cannot_tell,
    tie_all_in_same,
    rule_all_in_same,
    rule_stopped,
    tie_no_collective,
)
"""On NCCL (or when a rank waits for the GPU): recorder and counters before CPU positions."""

GLOO_RULES: tuple[Rule, ...] = (
    rule_nothing_captured,
    rule_divergent,
    tie_mismatched,
    rule_mismatched,
    rule_missing,
    rule_counters,
    tie_all_in_same,
    rule_all_in_same,
    rule_stopped,
    tie_no_collective,
)
"""On gloo a collective blocks the CPU: where the CPUs stop decides; counters break what it leaves open."""

LAST_RULE = rule_no_collective
"""What both tables answer when no rule of theirs matches."""


def rule_for(f: Facts) -> Ruling:
    """The first rule of the backend's table that matches; :data:`LAST_RULE` when none does."""
    for rule in NCCL_RULES if f.nccl else GLOO_RULES:
        ruling = rule(f)
        if ruling is not None:
            return ruling
    return LAST_RULE(f)


__all__ = [
    "GLOO_RULES",
    "LAST_RULE",
    "NCCL_RULES",
    "Rule",
    "is_loopback",
    "rule_all_in_same",
    "rule_counters",
    "rule_divergent",
    "rule_for",
    "rule_missing",
    "rule_no_collective",
    "rule_nothing_captured",
    "rule_stopped",
    "tie_all_in_same",
    "tie_cannot_tell",
    "tie_lone_collective",
    "tie_mismatched",
    "tie_no_collective",
]
