"""The hang rule for ranks blocked in different collectives, on either backend.

With a majority, the minority issued another collective (skipped, added or reordered on those
ranks), unless the minority waits on a subgroup the others are not in: then it was left there
by a member of its group that went on. With no majority, a rank condition above one side's
call decides; else the split names no one, and the progress counters may break the tie (a
tie-break rule of analysis/hang/verdict_rules.py).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace

from rankscope.analysis.hang.group_members import members as group_members
from rankscope.analysis.hang.loops import LoopLeft
from rankscope.analysis.hang.verdict_facts import Facts, Ruling
from rankscope.analysis.hang.verdict_phrases import (
    are,
    describe,
    describe_all,
    group_call,
    group_guard,
    group_loop,
    guard_phrase,
    library_phrase,
    lone_call,
    loop_phrase,
    parting_phrase,
    plural,
    recorder_lines,
)
from rankscope.analysis.hang.verdict_texts import Step, say, step
from rankscope.analysis.p2p import cycle_phrase, find_cycle
from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.core import Confidence, Group


def rule_mismatched(f: Facts) -> Ruling | None:
    """Ranks blocked (on the CPU) in different collectives: the minority issued another one."""
    if len(f.op_groups) <= 1:
        return None
    sizes = Counter(len(g.ranks) for g in f.op_groups)
    largest = max(len(g.ranks) for g in f.op_groups)
    extra: list[str] = []
    uneven: Step | None = None
    if sizes[largest] == 1:
        majority = next(g for g in f.op_groups if len(g.ranks) == largest)
        minority = [g for g in f.op_groups if g is not majority]
        called = any(group_call(f, g, majority) for g in minority)
        left = None if called else left_in_subgroup(f, majority, minority)
        if left is not None:
            return left
        suspects, confidence, summary, extra = _against_majority(f, majority, minority)
        uneven = loop_fix(f, minority, majority)
    else:
        suspects, confidence, summary = _even_split(f)
        split = _split_by_loop(f) if confidence == "low" else None
        if split is not None:
            suspects, confidence, summary, uneven = split
    cycle = find_cycle(f.waits)
    if cycle is not None:
        summary += f"; {cycle_phrase(cycle, f.waits)}"
    if f.gpu:
        summary += say("cpu_not_where_stuck", groups=describe_all(f.gpu_groups))
    recorder = () if f.on_gloo else (step("recorder_mismatch_seq"),)
    fix = library_fix(f, suspects) or guard_fix(f, suspects) or uneven
    return Ruling(
        kind="mismatched_collectives",
        suspects=suspects,
        confidence=confidence,
        summary=summary,
        evidence=[*f.evidence, *extra],
        steps=(fix or step("open_mismatch_site"), *recorder, step("repro_mismatch")),
    )


def guard_fix(f: Facts, suspects: list[int]) -> Step | None:
    """The fix a condition above a suspect's collective dictates, with its lines filled in: the
    agent gets it without opening the file (the summary quotes the condition, so it can check it;
    ``cond`` stays in the step's fields for a face that shows the step alone)."""
    for group in f.op_groups:
        found = group_guard(f, group) if group.ranks and group.ranks[0] in suspects else None
        if found is None:
            continue
        guard, site = found
        file = os.path.basename(site.file)
        call = group.call_site
        at = f"{file}:{site.line}"
        if call is not None and (call.file, call.line) != (site.file, site.line):
            at = f"{os.path.basename(call.file)}:{call.line} (called from {at})"
        key = "fix_rank_guard" if guard.kind == "rank" else "fix_data_guard"
        return step(
            key, op=group.op or "collective", site=at, cond=guard.condition, guard_at=f"{file}:{guard.line}"
        )
    return None


def library_fix(f: Facts, suspects: list[int], *, any_wait: bool = False) -> Step | None:
    """The fix when the suspects' collective is a library call: make it on every rank, keep the
    rank's own work (the file write) under the condition. ``any_wait``: the suspects may wait for
    the GPU inside the call (NCCL), not only in a collective."""
    for group in f.groups if any_wait else f.op_groups:
        call = lone_call(f, group) if group.ranks and group.ranks[0] in suspects else None
        if call is None:
            continue
        found = group_guard(f, group)
        under = ""
        if found is not None:
            guard, site = found
            under = f" under `{guard.condition}` at {os.path.basename(site.file)}:{guard.line}"
        return step(
            "fix_library_call",
            call=call.name,
            site=f"{os.path.basename(call.site.file)}:{call.site.line}",
            who=ranks_phrase(group.ranks),
            under=under,
        )
    return None


def loop_fix(f: Facts, minority: list[Group], majority: Group) -> Step | None:
    """The fix when a loop splits the ranks, read on the first minority group it splits."""
    return next((loop_step(left) for g in minority if (left := group_loop(f, g, majority)) is not None), None)


def loop_step(left: LoopLeft) -> Step:
    """The fix a loop dictates: the condition that sends some ranks out of an iteration early, else
    every rank must run it with the same collectives (uneven inputs)."""
    found = left.exit
    if found is None or found.guard is None:
        return step("fix_uneven_loop", loop_at=left.loop.at)
    where = f"the `{found.statement}` at {found.at}"
    remedy = (
        f"take {where} on every rank or on none"
        if found.guard.kind == "rank"
        else f"all_reduce the flag first, so every rank takes {where} alike"
    )
    return step("fix_loop_exit", remedy=remedy, guard_at=str(found.guard_at))


def _against_majority(
    f: Facts, majority: Group, minority: list[Group]
) -> tuple[list[int], Confidence, str, list[str]]:
    """The minority's ranks, and why they are elsewhere: a rank condition above a call, or where
    their stack leaves the majority's; partings that tell nothing new go to the evidence."""
    suspects = sorted(r for g in minority for r in g.ranks)
    conditions = [p for g in f.op_groups if (p := guard_phrase(f, g))]
    called = [(g, said) for g in minority if (said := library_phrase(f, g, majority))]
    if called:  # the call names the cause; the condition above it says who made it alone
        guards = [held for g, _ in called if (held := guard_phrase(f, g))]
        return suspects, "high", "; ".join([*(said for _, said in called), *guards]), []
    partings = [q for g in minority if (q := parting_phrase(f, g, majority))]
    # a rank condition above the suspects' own collective already tells why they are elsewhere
    guarded = any(guard_phrase(f, g) for g in minority)
    told = [text for text, telling in partings if telling and not guarded]
    summary = say(
        "mismatched_because"
        if conditions or told
        else "mismatched",  # a reason found needs no list of guesses
        minority=describe_all(minority),
        majority=describe(majority),
        who=ranks_phrase(suspects),
        are=are(len(suspects)),
    )
    if conditions:
        summary += f"; {'; '.join(conditions)}"
    if told:
        summary += f"; {'; '.join(told)}"
    # guarded: the condition is the story, and a parting's guess (a skipped batch) would contradict it
    extra = [] if guarded else [text for text, telling in partings if not telling]
    return suspects, "high", summary, extra


def _even_split(f: Facts) -> tuple[list[int], Confidence, str]:
    """Ranks split evenly between collectives: a rank condition above one side's call decides it."""
    described = describe_all(f.op_groups)
    ruled = [
        (g, p)
        for g in f.op_groups
        if (p := guard_phrase(f, g)) and (found := group_guard(f, g)) is not None and found[0].kind == "rank"
    ]
    if len(ruled) == 1:
        group, phrase = ruled[0]
        others = next((g for g in f.op_groups if g is not group), None)
        called = library_phrase(f, group, others) if others is not None and len(f.op_groups) == 2 else None
        if called is not None:  # a library collective under a rank condition: who made it alone is sure
            return list(group.ranks), "high", f"{called}; {phrase}"
        return (
            list(group.ranks),
            "medium",
            say(
                "even_split_ruled",
                described=described,
                phrase=phrase,
                who=ranks_phrase(group.ranks),
                run=plural(len(group.ranks), "runs", "run"),
            ),
        )
    return sorted(r for g in f.op_groups for r in g.ranks), "low", say("even_split", described=described)


def _split_by_loop(f: Facts) -> tuple[list[int], Confidence, str, Step | None] | None:
    """Two ranks (or halves) in different collectives, one past the loop the other is still in: the
    one that left issued fewer collectives in it (a two-GPU job that ran out of batches first).
    Medium: which side is wrong is the program's choice, but that side's loop is where to look."""
    if len(f.op_groups) != 2:
        return None
    a, b = f.op_groups
    left = group_loop(f, a, b)
    if left is None:
        return None
    out, inside = (b, a) if left.suspect_inside else (a, b)
    left = replace(left, suspect_inside=False)  # told from the side that left
    summary = say(
        "even_split_loop", described=describe_all(f.op_groups), phrase=loop_phrase(f, out, inside, left)
    )
    return list(out.ranks), "medium", summary, loop_step(left)


def left_in_subgroup(f: Facts, majority: Group, minority: list[Group]) -> Ruling | None:
    """The minority waits in a collective on a subgroup while the others went on: it is left waiting.

    A subgroup collective completes only when every member calls it; a member that skipped it
    went on to the next collective with the majority. The minority is the victim, and the culprit
    is the member of its group that went on: read from the job's locals (a table of groups or a
    list of ranks, :mod:`~rankscope.analysis.hang.group_members`), else from the flight recorder, else
    not named at all.
    """
    by_rank = {s.rank: s for s in f.live}
    waiting = [r for g in minority for r in g.ranks]
    if not waiting or not all(by_rank.get(r) is not None and by_rank[r].subgroup for r in waiting):
        return None
    if any(by_rank.get(r) is not None and by_rank[r].subgroup for r in majority.ranks):
        return None
    who = ranks_phrase(waiting)
    where = say("subgroup_where", minority=describe_all(minority), majority=describe(majority))
    named = _members_gone_on(f, waiting, majority)
    if named is not None:
        culprits, evidence, confidence = named
        summary = say(
            "subgroup_named",
            where=where,
            culprits=ranks_phrase(culprits),
            who=who,
            has=plural(len(culprits), "has", "have"),
            next=majority.op or say("the_next_collective"),
            they=plural(len(culprits), "it", "they"),
        )
        return _subgroup_ruling(culprits, confidence, summary, [evidence, *f.evidence])
    fr = f.flight.verdict if f.flight is not None else None
    if fr is not None and fr.suspect_ranks and fr.kind != "missing_ranks":
        # a rank that left no dump (asked, it did not answer in time) is no member that went on
        return _subgroup_ruling(
            list(fr.suspect_ranks),
            fr.confidence,
            say("subgroup_recorder", where=where, summary=fr.summary),
            recorder_lines(fr) + f.evidence,
        )
    summary = say(
        "subgroup_unnamed", where=where, who=who, are=are(len(waiting)), others=ranks_phrase(majority.ranks)
    )
    return _subgroup_ruling([], "low", summary, f.evidence)


def _members_gone_on(
    f: Facts, waiting: list[int], majority: Group
) -> tuple[list[int], str, Confidence] | None:
    """The members of the waiting ranks' groups that went on with the majority, read from locals."""
    culprits: set[int] = set()
    evidence: list[str] = []
    table = True
    for rank in waiting:
        read = group_members(rank, f.live)
        if read is None:
            return None
        found, text, from_table = read
        culprits |= {r for r in found if r in majority.ranks}
        evidence.append(text)
        table = table and from_table
    if not culprits:
        return None
    return sorted(culprits), "; ".join(dict.fromkeys(evidence)), "high" if table else "medium"


def _subgroup_ruling(
    suspects: list[int], confidence: Confidence, summary: str, evidence: list[str]
) -> Ruling:
    """A subgroup left waiting: read the culprit's loop when it is named, else find the group's members."""
    steps: tuple[Step, ...]
    if suspects:
        steps = (
            step("open_group_loop", who=ranks_phrase(suspects)),
            step("recorder_group_members"),
            step("repro_skipped"),
        )
    else:
        steps = (step("find_group_members"), step("recorder_group_members"))
    return Ruling("mismatched_collectives", suspects, confidence, summary, evidence, steps)


__all__ = ["guard_fix", "left_in_subgroup", "library_fix", "loop_fix", "loop_step", "rule_mismatched"]
