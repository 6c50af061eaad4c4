"""One verdict for a dead job from everything it left: the logs, the recorder's dumps, saved stacks.

Each source is read by its own analysis (``analysis.triage.logs.conclude``, ``analysis.recorder.flight.analyze``,
``analysis.hang.stacks.analyze``); this module only decides which of their answers leads. The flight
recorder outranks the others where they disagree: it records, per rank, every collective it
issued, its sizes and its state, while a log holds what each rank chose to print and saved stacks
hold one moment. Saved stacks outrank logs that name nobody (a rank blocked on a queue prints
nothing). A log that names a rank which failed on its own (an OOM, a CUDA error) keeps its
suspects when the recorder only says every rank waits in the same collective. The job's CUDA memory
snapshots lead a job that died of memory: their one finding names the rank, the site and the pattern
where an OOM line only says that an allocation failed. Pure: verdicts in, one answer out.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankscope.analysis.hang.frames import blocked_in, short_site
from rankscope.analysis.ranges import merge_rank_lines, ranks_phrase
from rankscope.analysis.triage.log_rules import SECTIONS
from rankscope.analysis.triage.logs import Conclusion, one_line, unique_steps
from rankscope.models.core import Finding, Group, NextStep, Verdict
from rankscope.models.logs import DecidedBy

SPECIFIC = ("mismatched_collectives", "divergent_ranks")
"""Verdicts that name the rank and what it did differently."""
_NAMES: dict[DecidedBy, str] = {
    "flight_recorder": "flight recorder",
    "stacks": "saved stacks",
    "logs": "logs",
}
_HANG_PLAYBOOK = "skill/communication-errors.md#collective-timeout"
DEAD_JOB_PLAYBOOK = "skill/crashes.md#dead-job"


@dataclass(frozen=True)
class PostMortem:
    """The answer's top: who, why, decided by which source, and where to read on."""

    suspect_ranks: list[int]
    victim_ranks: list[int]
    summary: str
    decided_by: DecidedBy | None
    evidence: list[str]
    next_steps: list[NextStep]
    playbook: str | None


def _decider(
    logs: Conclusion, findings: list[Finding], flight: Verdict | None, stacks: Verdict | None
) -> tuple[DecidedBy, Verdict | None]:
    """Which source leads, and its verdict (None for the logs, whose answer is the Conclusion)."""
    if flight is not None and flight.kind in SPECIFIC:
        return "flight_recorder", flight
    if stacks is not None and stacks.kind in SPECIFIC and not logs.suspect_ranks:
        return "stacks", stacks
    if logs.suspect_ranks:
        return "logs", None
    others = _others(flight, stacks)
    for name, verdict in others:
        if verdict is not None and verdict.suspect_ranks:
            return name, verdict
    for name, verdict in others:
        if verdict is not None and verdict.kind != "inconclusive":
            return name, verdict
    if not findings:  # nothing in the logs: the other source's own answer, even an unsure one
        for name, verdict in others:
            if verdict is not None:
                return name, verdict
    return "logs", None


def _others(flight: Verdict | None, stacks: Verdict | None) -> list[tuple[DecidedBy, Verdict | None]]:
    return [("flight_recorder", flight), ("stacks", stacks)]


def _playbook(
    decided_by: DecidedBy, findings: list[Finding], suspects: list[int], lead: Verdict | None
) -> str | None:
    """One skill section: the deciding verdict's own, the decisive finding's on the logs, the
    timeout playbook on a hang."""
    if decided_by != "logs":
        named = [s.skill_section for s in (lead.next_steps if lead else []) if s.skill_section]
        return named[0] if named else _HANG_PLAYBOOK
    for f in findings:
        if f.severity != "info" and f.kind in SECTIONS and (not f.ranks or set(f.ranks) & set(suspects)):
            if f.kind != "child_failed" and (suspects or not f.ranks):
                return SECTIONS[f.kind]
    return DEAD_JOB_PLAYBOOK if findings else None


def _dead_thread(findings: list[Finding], suspects: list[int], decided_by: DecidedBy) -> Finding | None:
    """The dead thread that tells the story beside one suspect of the recorder or the saved stacks:
    a thread of that rank (or of no rank the log names) died, and the rank waits for it since."""
    if decided_by == "logs" or len(suspects) != 1:
        return None
    return next(
        (f for f in findings if f.kind == "thread_died" and (not f.ranks or f.ranks == suspects)), None
    )


def _saved_place(rank: int, groups: list[Group]) -> str:
    """`` (saved stacks: loader.py:19 blocked in Queue.get (queue.py:171))``: where the saved stacks
    hold ``rank``, or nothing when they do not hold it."""
    group = next((g for g in groups if rank in g.ranks), None)
    if group is None or group.call_site is None:
        return ""
    inner = blocked_in(group.frames)
    return f" ({_NAMES['stacks']}: {short_site(group.call_site)}{f' blocked in {inner}' if inner else ''})"


def _thread_story(thread: Finding, rank: int, name: str, groups: list[Group]) -> tuple[str, NextStep]:
    """The summary a dead thread leads, and its fix as the first step."""
    site = thread.facts.get("call_site")
    at = f" (at {site})" if site else ""
    whose = f"rank {rank}'s" if thread.ranks else f"most likely rank {rank}'s (the one the {name} single out)"
    where = _saved_place(rank, groups)
    summary = (
        f"A thread died, {whose}: {thread.message}{at}. Rank {rank} then waits for the thread's output{where} and "
        f"the other ranks wait for rank {rank}."
    )
    fix = NextStep(
        action=f"Fix: the exception{at}; then make the consumer fail fast: put the exception on the queue and "
        "raise it there, or get(timeout=...), so the rank dies with the real error instead of hanging.",
        skill_section=SECTIONS["thread_died"],
    )
    return summary, fix


LIVE_ONLY_TOOLS = frozenset({"dump_stacks"})
"""Steps of a stacks verdict that need the job still running; saved stacks are a dead job's."""


def _live_steps(steps: list[NextStep], decided_by: DecidedBy) -> list[NextStep]:
    """A saved stack's verdict without the steps that would dump the (dead) job again."""
    if decided_by != "stacks":
        return steps
    return [s for s in steps if s.tool not in LIVE_ONLY_TOOLS and not (s.args or {}).get("from_last_stacks")]


def _steps(*lists: list[NextStep]) -> list[NextStep]:
    return unique_steps(*lists)[:6]


def _with_memory(post: PostMortem, logs: Conclusion, memory: Finding) -> PostMortem:
    """The memory finding of the job's CUDA snapshots leads a dead job that the logs alone explain:
    it names the rank, the site that holds the memory and the pattern, where an OOM line only says
    that an allocation failed, and its fix replaces the log's generic OOM advice."""
    suspects = memory.ranks or post.suspect_ranks
    section = next((s.skill_section for s in memory.next_steps if s.skill_section), None)
    first = (memory.fix or "").split(". ", 1)[0].rstrip(".")  # the finding above carries the rest
    fix = NextStep(action=f"Fix: {first}.", skill_section=section)
    steps = [
        s for s in post.next_steps if s.tool != "inspect_memory" and s.skill_section != SECTIONS["cuda_oom"]
    ]
    summary = f"From the memory snapshots: {memory.message}." + (
        f" Logs: {logs.summary}" if logs.summary else ""
    )
    return PostMortem(
        suspect_ranks=suspects,
        victim_ranks=sorted(set(post.victim_ranks) - set(suspects)),
        summary=summary,
        decided_by="memory_snapshots",
        evidence=post.evidence,
        next_steps=_steps([fix], [s for s in memory.next_steps if s.tool], steps),
        playbook=section or post.playbook,
    )


def combine(
    logs: Conclusion,
    findings: list[Finding],
    flight: Verdict | None,
    stacks: Verdict | None,
    groups: list[Group] | None = None,
    memory: Finding | None = None,
) -> PostMortem:
    """The one answer: the leading source's suspects and summary, every source's evidence.
    ``groups``: the saved stacks' groups, which say where a rank stands; ``memory``: the one finding
    of the job's CUDA memory snapshots, which leads when the recorder and the stacks name nobody."""
    post = _combine(logs, findings, flight, stacks, groups)
    if memory is None:
        return post
    oom = memory.severity == "error" or any(f.kind == "cuda_oom" for f in findings)
    if not oom or (post.decided_by in ("flight_recorder", "stacks") and post.suspect_ranks):
        # the job did not die of memory, or another source names who stopped it: a side note
        post.evidence.append(f"memory snapshots: {memory.message}")
        return post
    return _with_memory(post, logs, memory)


def _combine(
    logs: Conclusion,
    findings: list[Finding],
    flight: Verdict | None,
    stacks: Verdict | None,
    groups: list[Group] | None,
) -> PostMortem:
    several = flight is not None or stacks is not None
    decided_by, lead = _decider(logs, findings, flight, stacks)
    thread: Finding | None = None  # a dead thread that tells the story beside the lead's one suspect
    if lead is None:
        suspects, summary, evidence = logs.suspect_ranks, logs.summary, list(logs.evidence)
        steps = _steps(logs.next_steps)
    else:
        name = _NAMES[decided_by]
        suspects = list(lead.suspect_ranks)
        summary = f"From the {name}: {lead.summary}."
        logs_summary = logs.summary
        first: list[NextStep] = []
        thread = _dead_thread(findings, suspects, decided_by)
        if thread is not None:
            summary, fix = _thread_story(thread, suspects[0], name, groups or [])
            logs_summary = logs_summary.replace(one_line(thread), "").strip()
            first = [fix]
        if findings and logs_summary:
            summary += f" Logs: {logs_summary}"
        elif several and not findings:
            summary += " The logs hold no known failure pattern."
        evidence = [f"{name}: {e}" for e in merge_rank_lines(lead.evidence)] + list(logs.evidence)
        done = {"triage_logs", *(["analyze_flight_recorder"] if flight is not None else [])}
        lead_steps = _live_steps(lead.next_steps, decided_by) if thread is None else []
        others = [x for x in logs.next_steps if thread is None or x.skill_section != SECTIONS["thread_died"]]
        steps = [s for s in _steps(first, lead_steps, others) if s.tool not in done]  # this call did them
        if logs.suspect_ranks and set(logs.suspect_ranks) != set(suspects):
            evidence.append(
                f"the logs named {ranks_phrase(logs.suspect_ranks)}; the {name} outranks them here"
            )
    for other, verdict in _others(flight, stacks):
        if verdict is not None and verdict is not lead:
            evidence.append(f"{_NAMES[other]} ({verdict.kind}): {verdict.summary}")
    return PostMortem(
        suspect_ranks=suspects,
        victim_ranks=sorted(set(logs.victim_ranks) - set(suspects)),
        summary=summary,
        decided_by=decided_by if several else None,
        evidence=evidence,
        next_steps=steps,
        playbook=SECTIONS["thread_died"]
        if thread is not None
        else _playbook(decided_by, findings, suspects, lead),
    )


__all__ = ["DEAD_JOB_PLAYBOOK", "SPECIFIC", "PostMortem", "combine"]
