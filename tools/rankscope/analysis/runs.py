"""What a `rankscope run` saw, as pure functions: torchrun's failure summary, the one-line
summary and next steps of a run, and the agent-sized form of its report."""

from __future__ import annotations

import contextlib
import re
import signal

from rankscope.analysis.collapse import format_ranks
from rankscope.analysis.sizing.bound import bound_report
from rankscope.models.core import NextStep, StacksReport
from rankscope.models.run import CollapsedLine, RankExit, RunOutcome, RunReport

# ------------------------------------------------------------ torchrun's failure summary

_BLOCK_START = re.compile(r"^\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s+(\w+)\s*:\s?(.*)$")
_RANK_FIELD = re.compile(r"(-?\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT_FIELD = re.compile(r"(-?\d+)\s*\(pid:\s*(\d+)\)\s*(?:\((SIG\w+)\))?")


def parse_failures(lines: list[str]) -> list[RankExit]:
    """Ranks named in torchrun's ChildFailedError summary, root cause first.

    The summary (torch/distributed/elastic/multiprocessing/errors) lists
    ``Failures:`` and ``Root Cause (first observed failure):`` as blocks of
    ``[i]:`` followed by ``rank : R (local_rank: L)``, ``exitcode : C (pid: P)``
    and ``traceback : ...`` fields.
    """
    exits: list[RankExit] = []
    section = ""
    current: dict[str, str] | None = None

    def flush() -> None:
        nonlocal current
        if current is not None and "rank" in current:
            exits.append(_rank_exit(current, root=section == "root"))
        current = None

    for line in lines:
        stripped = line.strip()
        if stripped.startswith("Failures:"):
            flush()
            section = "failures"
        elif stripped.startswith("Root Cause"):
            flush()
            section = "root"
        elif _BLOCK_START.match(stripped) and section:
            flush()
            current = {}
        elif stripped.startswith("====") or stripped.startswith("----"):
            flush()
        elif current is not None:
            m = _FIELD.match(line)
            if m:
                current[m.group(1)] = m.group(2).strip()
    flush()
    exits.sort(key=lambda e: (not e.root_cause, e.rank))
    unique: dict[int, RankExit] = {}
    for e in exits:
        unique.setdefault(e.rank, e)
    return list(unique.values())


def _rank_exit(fields: dict[str, str], root: bool) -> RankExit:
    rank_m = _RANK_FIELD.search(fields.get("rank", ""))
    exit_m = _EXIT_FIELD.search(fields.get("exitcode", ""))
    rank = int(rank_m.group(1)) if rank_m else int(fields.get("rank", "-1").split()[0] or -1)
    code = int(exit_m.group(1)) if exit_m else None
    sig = exit_m.group(3) if exit_m and exit_m.group(3) else None
    if sig is None and code is not None and code < 0:
        with contextlib.suppress(ValueError):
            sig = signal.Signals(-code).name
    tb = fields.get("traceback")
    return RankExit(
        rank=rank,
        local_rank=int(rank_m.group(2)) if rank_m else None,
        exit_code=code,
        signal=sig,
        pid=int(exit_m.group(2)) if exit_m else None,
        root_cause=root,
        detail=None if not tb or tb.startswith("To enable traceback") else tb,
    )


# ------------------------------------------------------------ summary and next steps


def describe_exit(e: RankExit) -> str:
    if e.signal:
        return f"rank {e.rank} ({e.signal})"
    return f"rank {e.rank} (exit code {e.exit_code})"


def run_summary(
    outcome: RunOutcome,
    nproc: int,
    exit_code: int | None,
    failed: list[RankExit],
    stacks: StacksReport | None,
    evidence: str | None,
    duration: float,
) -> str:
    if outcome == "ok":
        return f"All {nproc} rank(s) finished; torchrun exited 0 after {duration:.1f}s."
    if outcome == "crashed":
        if not failed:
            return f"torchrun exited {exit_code} after {duration:.1f}s; it reported no failed rank (see launcher_output)."
        root = [e for e in failed if e.root_cause] or failed[:1]
        others = [e for e in failed if e not in root and e.signal != "SIGTERM"]
        stopped = [e for e in failed if e not in root and e.signal == "SIGTERM"]
        text = f"Failed first: {', '.join(map(describe_exit, root))}"
        if others:
            text += f"; then {', '.join(map(describe_exit, others))}"
        if stopped:
            text += f"; torchrun then stopped {'rank' if len(stopped) == 1 else 'ranks'} {format_ranks(e.rank for e in stopped)}"
        return text + f". torchrun exited {exit_code} after {duration:.1f}s."
    if outcome == "hung":
        if stacks is None:
            return f"Hung: {evidence}. Stacks could not be captured (see notes); the job was terminated."
        return f"Hung: {evidence}. Stacks captured, then the job was terminated. Verdict: {stacks.verdict.summary}"
    return f"Timed out: {evidence}; the job was terminated."


def run_next_steps(
    outcome: RunOutcome, failed: list[RankExit], stacks: StacksReport | None
) -> list[NextStep]:
    if outcome == "crashed" and failed:
        root = next((e for e in failed if e.root_cause), failed[0])
        if root.signal is not None:
            return [
                NextStep(
                    action=f"Rank {root.rank} was killed by {root.signal}: check the kernel log (dmesg) for the OOM "
                    f"killer and rank {root.rank}'s last output; SIGSEGV/SIGABRT point at native code.",
                    tool="triage_logs",
                    skill_section="skill/crashes.md#killed-by-signal",
                )
            ]
        return [
            NextStep(
                action=f"Read rank {root.rank}'s stderr (ranks[{root.rank}].stderr): its traceback is the first failure; "
                "the other ranks' errors usually follow from it.",
                tool="triage_logs",
                skill_section="skill/crashes.md#child-failed",
            )
        ]
    if outcome == "hung" and stacks is not None:
        return list(stacks.verdict.next_steps)
    if outcome == "hung":
        return [
            NextStep(
                action="Run the job again and attach by hand: rankscope stacks <torchrun pid>.",
                tool="dump_stacks",
            )
        ]
    if outcome == "timeout":
        return [
            NextStep(
                action="Run again with a hang timeout (rankscope run --hang-timeout 60) to get stacks when it stops progressing.",
                tool="run_all_ranks",
            )
        ]
    return []


# ------------------------------------------------------------ the agent-sized report

MAX_COLLAPSED_BYTES = 12_000
MAX_STACKS_BYTES = 12_000


def _cap_lines(lines: list[CollapsedLine], budget: int) -> tuple[list[CollapsedLine], int]:
    """Keep the head and tail of ``lines`` within ``budget`` bytes; return them and how many were cut."""
    sizes = [len(line.text) + 8 * len(line.ranks) + 40 for line in lines]
    if sum(sizes) <= budget:
        return lines, 0
    head: list[CollapsedLine] = []
    tail: list[CollapsedLine] = []
    used = 0
    i, j = 0, len(lines) - 1
    while i <= j:
        take_head = len(head) <= len(tail)
        k = i if take_head else j
        if used + sizes[k] > budget:
            break
        used += sizes[k]
        if take_head:
            head.append(lines[i])
            i += 1
        else:
            tail.append(lines[j])
            j -= 1
    cut = len(lines) - len(head) - len(tail)
    marker = CollapsedLine(ranks=[], text=f"… {cut} line(s) cut …", uniform=False)
    return [*head, marker, *reversed(tail)], cut


def bound_run_report(report: RunReport, max_collapsed_bytes: int = MAX_COLLAPSED_BYTES) -> RunReport:
    """The agent-sized form of a report: collapsed output capped, raw output dropped, stacks bounded."""
    out, cut_out = _cap_lines(report.collapsed_stdout, max_collapsed_bytes)
    err, cut_err = _cap_lines(report.collapsed_stderr, max_collapsed_bytes // 2)
    stacks = report.stacks
    if stacks is not None:
        stacks = bound_report(stacks, max_bytes=MAX_STACKS_BYTES)
    cut = []
    if cut_out:
        cut.append(f"{cut_out} collapsed stdout line(s)")
    if cut_err:
        cut.append(f"{cut_err} collapsed stderr line(s)")
    raw = sum(len(r.stdout) + len(r.stderr) for r in report.ranks)
    if raw:
        cut.append(f"raw per-rank output ({raw} line(s))")
    hint = None
    if cut:
        hint = (
            "Left out: "
            + ", ".join(cut)
            + ". For everything, run `rankscope run --json --nproc N -- SCRIPT ARGS` "
            "or print less per rank (rankscope.probe.print_all_ranks collapses as it goes)."
        )
    return report.model_copy(
        update={
            "collapsed_stdout": out,
            "collapsed_stderr": err,
            "ranks": [],
            "launcher_output": report.launcher_output[-40:],
            "stacks": stacks,
            "truncated": bool(cut_out or cut_err)
            or report.truncated
            or bool(stacks is not None and stacks.truncated),
            "hint": hint,
        }
    )
