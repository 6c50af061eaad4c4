"""How the hang verdict names what it saw: a group of ranks and where it waits, a process state,
the transport, a rank condition above a call, where one rank's stack leaves the others'.

These phrases fill the ``{fields}`` of the sentences in analysis/hang/verdict_texts.py and the
evidence lines; they say, and decide nothing.
"""

from __future__ import annotations

import os

from rankscope.analysis.hang.conditions import Guard
from rankscope.analysis.hang.frames import (
    STUCK_STATES,
    blocked_in,
    is_user_frame,
    lib_where,
    main_thread,
    parting,
    short_site,
)
from rankscope.analysis.hang.library_calls import LibraryCall
from rankscope.analysis.hang.loops import Loop, LoopLeft, loop_left
from rankscope.analysis.hang.verdict_facts import Facts
from rankscope.analysis.hang.verdict_texts import RAN_OUT_EARLY, STATE_WORDS, say
from rankscope.analysis.hang.waits import GPU_LIKE, wait_phrase
from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.core import Backend, CallSite, Frame, Group, RankStack, Verdict


def are(count: int) -> str:
    """The verb for ``count`` ranks: ``are`` for several, ``is`` for one."""
    return "are" if count > 1 else "is"


def describe(group: Group) -> str:
    """``ranks 0-1 wait in all_reduce at train.py:9``, ``rank 2 waits for the GPU at ...``,
    ``rank 3 is in no collective, at train.py:40 blocked in Queue.get``."""
    who = ranks_phrase(group.ranks)
    plural = len(group.ranks) > 1
    if group.wait in GPU_LIKE:
        what = wait_phrase(group.wait or "")
        if not plural:
            what = what.replace("wait ", "waits ", 1).replace("are ", "is ", 1)
        inside = f" (inside {group.op})" if group.op else ""
        return f"{who} {what} at {short_site(group.call_site)}{inside}"
    if group.op:
        return f"{who} {'wait' if plural else 'waits'} in {group.op} at {short_site(group.call_site)}"
    inner = blocked_in(group.frames)
    return f"{who} {are(len(group.ranks))} in no collective, at {short_site(group.call_site)}" + (
        f" blocked in {inner}" if inner else ""
    )


def describe_all(groups: list[Group]) -> str:
    """:func:`describe` of each group, one after the other."""
    return "; ".join(describe(g) for g in groups)


def state_words(state: str | None) -> str:
    """``stopped (state T: SIGSTOP, Ctrl-Z or a debugger)``: what a process state means."""
    return STATE_WORDS.get(state or "", state or "")


def stopped_groups(f: Facts) -> list[str]:
    """``rank 3 is stopped (state T: ...)`` for each group of stopped, traced or D-state ranks."""
    return [
        f"{ranks_phrase(g.ranks)} {are(len(g.ranks))} {state_words(g.state)}"
        for g in f.groups
        if g.state in STUCK_STATES
    ]


def other_side(direction: str) -> str:
    """The call a blocking ``direction`` waits for: ``send`` for a recv, ``receive`` for a send."""
    return "send" if direction == "recv" else "receive"


def transport(backend: Backend | None) -> str:
    """The transport a stuck collective may wait on, named for this job's backend."""
    if backend in ("nccl", "gloo"):
        return f"the network or the {'NCCL' if backend == 'nccl' else 'Gloo'} transport"
    return "the network or the backend's transport (NCCL or Gloo)"


def _lead(f: Facts, group: Group) -> tuple[RankStack, list[Frame]] | None:
    """A group's lead rank and its main thread's frames."""
    lead = next((s for s in f.annotated if group.ranks and s.rank == group.ranks[0]), None)
    thread = main_thread(lead) if lead is not None else None
    return (lead, thread.frames) if lead is not None and thread is not None else None


def group_loop(f: Facts, suspects: Group, majority: Group) -> LoopLeft | None:
    """The loop one side is still in and the other has left (uneven inputs), read on the lead ranks."""
    a, b = _lead(f, suspects), _lead(f, majority)
    if a is None or b is None or not f.source:
        return None
    return loop_left(a[1], b[1], f.source, (a[0].counters, b[0].counters))


def loop_count(f: Facts, ranks: list[int], loop: Loop) -> str:
    """`` (at step=31)``: the loop's counter on the ranks still in it, when those read agree; ``(rank 0
    at step=31)`` when it was read on some of them only (a sure verdict reads one rank per group)."""
    read = {s.rank: n for s in f.annotated if s.rank in ranks and (n := loop.count(s.counters)) is not None}
    if len(set(read.values())) != 1:
        return ""
    value = next(iter(read.values()))
    on = "" if len(read) == len(ranks) else f"{ranks_phrase(sorted(r for r in read if r is not None))} "
    return f" ({on}at {loop.counter}={value})"


def loop_phrase(f: Facts, suspects: Group, majority: Group, left: LoopLeft) -> str:
    """``rank 5 has left the loop at train.py:99 `for ...` that ranks 0-4,6-7 are still in (at step=31): ...``."""
    who, they = ranks_phrase(suspects.ranks), ranks_phrase(majority.ranks)
    one, many = len(suspects.ranks) == 1, len(majority.ranks) > 1
    inside = suspects if left.suspect_inside else majority
    fields = {
        "who": who,
        "they": they,
        "loop_at": left.loop.at,
        "header": left.loop.header,
        "count": loop_count(f, inside.ranks, left.loop),
    }
    if left.suspect_inside:
        return say(
            "still_in_the_loop", be=("is" if one else "are"), have=("have" if many else "has"), **fields
        )
    found, why = left.exit, say("left_uneven")
    if found is not None and found.guard is not None:
        why = say(
            "left_by_exit",
            cond=found.guard.condition,
            guard_at=found.guard_at,
            statement=found.statement,
            exit_at=found.at,
        )
        if left.same_body:
            return say("skipped_in_body", be="is" if one else "are", why=why, **fields)
    return say(
        "left_the_loop",
        why=why,
        has=("has" if one else "have"),
        are=("are" if many else "is"),
        ran_out_early=RAN_OUT_EARLY,
        **fields,
    )


def parting_phrase(f: Facts, suspects: Group, majority: Group) -> tuple[str, bool] | None:
    """``rank 1 leaves ranks 0,2-3 in Trainer.fit (trainer.py): at line 68, they at line 67 ...``, and
    whether it says more than the call sites do (library code, a suspect past the others' line, or
    the loop one side has left)."""
    a, b = _lead(f, suspects), _lead(f, majority)
    if a is None or b is None:
        return None
    found = parting(a[1], b[1])
    if found is None:
        return None
    fa, fb = found
    who, they = ranks_phrase(suspects.ranks), ranks_phrase(majority.ranks)
    where = f"{fa.function} ({lib_where(fa).rsplit(':', 1)[0]})"
    library = not is_user_frame(fa)
    if fa.line == fb.line:
        return say("part_below", who=who, they=they, where=where, line=fa.line), library
    leaves = "leaves" if len(suspects.ranks) == 1 else "leave"
    text = say("parting", who=who, leaves=leaves, they=they, where=where, line=fa.line, their_line=fb.line)
    left = group_loop(f, suspects, majority)
    if left is not None:  # the loop says why they part; its line numbers would only repeat it
        return loop_phrase(f, suspects, majority, left), True
    later = fa.line is not None and fb.line is not None and fa.line > fb.line
    if later:
        text += say("past_the_block", who=who, ran_out_early=RAN_OUT_EARLY)
    return text, library or later


def group_call(f: Facts, group: Group, others: Group) -> LibraryCall | None:
    """The library call (itself a collective) a group's lead rank is in and the others' lead is not."""
    call = f.calls.get(group.ranks[0]) if group.ranks else None
    theirs = _lead(f, others)
    if call is None or theirs is None:
        return None
    mark = (call.frame.function, call.frame.file)
    return None if any((fr.function, fr.file) == mark for fr in theirs[1]) else call


def library_phrase(f: Facts, group: Group, others: Group) -> str | None:
    """``rank 0 alone called ZeroRedundancyOptimizer.consolidate_state_dict (ckpt.py:21: `...`), a
    collective every rank of its group must call: it waits in broadcast inside it, while ranks 1-3
    went on to all_reduce at train.py:74``."""
    call = group_call(f, group, others)
    if call is None:
        return None
    went = f"{ranks_phrase(others.ranks)} went on to {others.op or 'another call'} at {short_site(others.call_site)}"
    return call_phrase(f, group.ranks, call, went)


def call_phrase(f: Facts, who: list[int], call: LibraryCall, others: str) -> str:
    """The library call ``who`` made alone, quoted from the job's line, and where the others are."""
    line = f.source.get((call.site.file, call.site.line or 0), "").strip()
    text = say(
        "library_call",
        who=ranks_phrase(who),
        call=call.name,
        site=short_site(call.site),
        line=line[:80],
        how=call.how,
        others=others,
    )
    return text if line else text.replace(": ``", "")


def inside_phrase(f: Facts, who: list[int], call: LibraryCall) -> str:
    """``rank 0 is inside DistributedDataParallel(...) (train.py:30: `...`), a collective every rank of
    its group must call: its CPU waits inside it, at ...``: for ranks in no collective frame."""
    line = f.source.get((call.site.file, call.site.line or 0), "").strip()
    text = say(
        "inside_call",
        who=ranks_phrase(who),
        be=are(len(who)),
        call=call.name,
        site=short_site(call.site),
        line=line[:80],
        how=call.how,
    )
    return text if line else text.replace(": ``", "")


def recorder_lines(recorder: Verdict) -> list[str]:
    """The recorder's first evidence lines, each marked as the recorder's."""
    return [say("recorder_line", line=line) for line in recorder.evidence[:6]]


def plural(count: int, one: str, many: str) -> str:
    """``one`` for a single rank, ``many`` for several."""
    return many if count > 1 else one


def group_guard(f: Facts, group: Group) -> tuple[Guard, CallSite] | None:
    """The condition above a group's call (read on its lead rank), with the frame it guards."""
    return f.guards.get(group.ranks[0]) if group.ranks else None


def guard_phrase(f: Facts, group: Group) -> str | None:
    """``train.py:9 `if dist.get_rank() == 0:` guards the barrier at train.py:10`` for a group's lead rank."""
    found = group_guard(f, group)
    if found is None:
        return None
    guard, site = found
    what = "call" if lone_call(f, group) is not None else group.op or "call"
    return guard.phrase(os.path.basename(site.file), what, site.line)


def lone_call(f: Facts, group: Group) -> LibraryCall | None:
    """The library call (itself a collective) a group's lead rank is in, when no rank outside the
    group runs it: the condition above it guards that call, not the collective inside it."""
    call = f.calls.get(group.ranks[0]) if group.ranks else None
    if call is None:
        return None
    mark = (call.frame.function, call.frame.file)
    for s in f.annotated:
        thread = main_thread(s) if s.rank not in group.ranks else None
        if thread is not None and any((fr.function, fr.file) == mark for fr in thread.frames):
            return None
    return call


__all__ = [
    "are",
    "call_phrase",
    "describe",
    "describe_all",
    "group_call",
    "group_guard",
    "group_loop",
    "guard_phrase",
    "inside_phrase",
    "library_phrase",
    "lone_call",
    "loop_count",
    "loop_phrase",
    "other_side",
    "parting_phrase",
    "plural",
    "recorder_lines",
    "state_words",
    "stopped_groups",
    "transport",
]
