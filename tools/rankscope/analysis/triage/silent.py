"""A rank that left no traceback while the others timed out: where they waited, and what the code
has it pass on its way there.

The logs of a dead job say who waited (each timed-out rank's traceback ends in the collective's
line) and, by omission, who did not: a rank that reported no timeout and raised nothing stopped
elsewhere, and the launcher's SIGTERM ended it without a word. Nothing in the log says where. The
code does, in part: the blocking calls between the start of the function and that collective
(``blocking_calls``). This module picks the silent ranks and the collective from the findings,
and makes the one sentence that leads the answer. Under NCCL the watchdog's lines carry no Python
line; without a traceback that names one, nothing is read and nothing more is claimed.
Pure: findings in, models out; the shell reads the file.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from rankscope.analysis.ranges import ranks_phrase
from rankscope.analysis.triage.blocking_calls import blocking_calls
from rankscope.analysis.triage.logs import TIMEOUT_SENTENCE
from rankscope.analysis.triage.postmortem import LIVE_ONLY_TOOLS, PostMortem
from rankscope.models.core import Finding, NextStep
from rankscope.models.logs import SilentRanks

HANG_PLAYBOOK = "skill/communication-errors.md#collective-timeout"
_SAME_WORK = re.compile(r"Collectives timed out: [^.]*no rank fell behind on the CPU[^.]*\.")
_QUIET_KINDS = frozenset({"child_failed", "launcher_stopped", "exit_without_destroy", "fr_dump_signal"})
"""Findings that say nothing of where a rank was: the launcher's table, its stop, an exit warning,
NCCL's note that another rank's timeout asked it for a recorder dump."""


@dataclass(frozen=True)
class SilentSite:
    """The silent ranks and the collective the others' tracebacks name."""

    ranks: list[int]
    waited: list[int]
    file: str
    line: int
    function: str


def _spoke(f: Finding) -> bool:
    """Whether a finding is the rank's own word (an error it raised), not the launcher's about it."""
    if f.kind in _QUIET_KINDS:
        return False
    return not (f.kind == "killed_by_signal" and f.facts.get("sent_by_launcher"))


def _site(call_site: str) -> tuple[str, int, str] | None:
    """``/x/train.py:55 in main`` -> (file, line, function)."""
    where, _, function = call_site.partition(" in ")
    file, _, line = where.rpartition(":")
    return (file, int(line), function) if file and line.isdigit() else None


def silent_site(
    findings: list[Finding], suspects: list[int], stacks: Mapping[int, str] | None = None
) -> SilentSite | None:
    """The suspects that said nothing themselves, and the line most timed-out ranks' tracebacks (or,
    ``stacks``, NCCL's stacks of the failed collective, per rank) end in; None when no suspect is
    silent or no timeout names a line of the user's code."""
    spoke = {r for f in findings if _spoke(f) for r in f.ranks}
    silent = [r for r in suspects if r not in spoke]
    named: dict[int, str] = dict(stacks or {})
    for f in findings:
        if f.kind == "collective_timeout" and f.facts.get("call_site"):
            named.update({r: str(f.facts["call_site"]) for r in f.ranks})
    sites: Counter[tuple[str, int, str]] = Counter()
    waited: dict[tuple[str, int, str], set[int]] = {}
    for rank, call_site in named.items():
        site = _site(call_site) if rank not in silent else None
        if site is not None:
            sites[site] += 1
            waited.setdefault(site, set()).add(rank)
    if not silent or not sites:
        return None
    (file, line, function), _ = sites.most_common(1)[0]
    return SilentSite(silent, sorted(waited[(file, line, function)]), file, line, function)


def read_silent(site: SilentSite, source: str | None, shown: str, note: str | None = None) -> SilentRanks:
    """The silent ranks with the blocking calls the code (``source``, read from ``shown``) has them pass;
    ``note`` says why the code could not be read when ``source`` is None."""
    lines = source.splitlines() if source is not None else []
    code = lines[site.line - 1].strip() if 0 < site.line <= len(lines) else ""
    return SilentRanks(
        ranks=site.ranks,
        waited=site.waited,
        collective=f"{shown}:{site.line} in {site.function}",
        code=code,
        calls=blocking_calls(source, site.line) if source is not None else [],
        note=note,
    )


def silent_story(s: SilentRanks) -> str:
    """The sentence that leads the answer: who said nothing, where the others waited, what to read."""
    who = ranks_phrase(s.ranks)
    waited = f"{ranks_phrase(s.waited)} timed out" if s.waited else "the others timed out"
    code = f" (`{s.code}`)" if s.code else ""
    head = f"{who[0].upper()}{who[1:]} left no traceback while {waited} in the collective at {s.collective}{code}"
    if s.note:
        return f"{head}; {s.note}."
    if not s.calls:
        return (
            f"{head}; on its way there the code holds no call known to block (a long step, a loop or a library "
            "call): only a capture of its stack at the stall can say where it was."
        )
    n = len(s.calls)
    they = "it passes" if len(s.ranks) == 1 else "they pass"
    return f"{head}. On its way there {they} {n} blocking call{'s' if n > 1 else ''} (read from the code, not a stack)."


def call_lines(s: SilentRanks) -> list[str]:
    """One line per blocking call: where, through which call, what it waits on."""
    out = []
    for c in s.calls:
        via = f" (via {c.via})" if c.via else ""
        later = " (after the collective, before the next pass)" if c.later_in_loop else ""
        out.append(f":{c.line} `{c.code}`{via}{later}: {c.waits_on}")
    return out


def beyond_timeouts(summary: str, suspects: list[int], victims: list[int]) -> str:
    """What the logs' summary says beside the timeouts and the suspects, which a story that names
    who waited where (a silent rank's code, a watch's capture) says better."""
    said = [
        TIMEOUT_SENTENCE,
        f"Suspect rank(s): {', '.join(map(str, suspects))}.",
        f"Victims (failed because of another rank): {', '.join(map(str, victims))}.",
    ]
    rest = _SAME_WORK.sub("", summary)  # "no rank fell behind": the silent rank did, by not arriving
    for sentence in said:
        rest = rest.replace(sentence, "")
    return " ".join(rest.split())


def fix_step(s: SilentRanks) -> NextStep:
    """The step after the story: read the first candidate, and make its wait fail loudly."""
    first = s.calls[0] if s.calls else None
    read = f"Read :{first.line} and what ends its wait" if first else f"Read {s.collective}"
    return NextStep(
        action=f"{read}; give the wait a timeout that raises, so the rank fails with its own traceback. "
        "If it may hang again, start a watch beside the job.",
        skill_section=HANG_PLAYBOOK,
    )


def with_silent(post: PostMortem, s: SilentRanks) -> PostMortem:
    """The post-mortem led by the silent ranks' story; the steps that need a live job left out."""
    story = silent_story(s)
    rest = beyond_timeouts(post.summary, post.suspect_ranks, post.victim_ranks)
    steps = [x for x in post.next_steps if x.tool not in LIVE_ONLY_TOOLS]
    return replace(
        post,
        summary=f"{story} {rest}".strip(),
        next_steps=[fix_step(s), *steps][:6],
        playbook=HANG_PLAYBOOK,
    )


__all__ = [
    "SilentSite",
    "beyond_timeouts",
    "call_lines",
    "read_silent",
    "silent_site",
    "silent_story",
    "with_silent",
]
