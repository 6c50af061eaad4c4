"""What the scan works out once every line is read: findings from the failure records, then two
passes over all findings that only the whole log can decide.

The launcher's records (torchrun's table, mp.spawn's exits, error.json) say which workers failed and
how; they become a ``child_failed`` finding and one ``killed_by_signal`` per signal death. Whether a
SIGABRT is NCCL's watchdog at work, and whether an NCCL error only repeats a duplicate GPU, depends
on findings that may come later in the log, so both are decided here, after the scan.
"""

from __future__ import annotations

from typing import Any

from rankscope.analysis.triage.accumulator import MAX_LINES_PER_FINDING, Accumulator, Draft
from rankscope.analysis.triage.log_rules import EXIT_WITHOUT_DESTROY_FIX, SECTIONS, SIGNAL_MEANING, Role
from rankscope.analysis.triage.torchrun_lines import SIGNAME, Placed
from rankscope.models.core import NextStep

WATCHDOG_EVIDENCE = frozenset(
    {
        "collective_timeout",
        "fr_dump_signal",
        "nccl_error",
        "cuda_error",
        "device_assert",
        "cuda_oom",
        "gpu_xid",
    }
)
"""Kinds after which NCCL's watchdog aborts the process: a SIGABRT that follows one is its consequence."""

_CHILD_FAILED_EXPLANATION = (
    "torchrun (or the spawn parent) lists every failed local worker and calls the earliest one the "
    "'Root Cause (first observed failure)'. It is only the first to exit: a rank that timed out waiting "
    "for a stuck peer exits first and gets named, while the stuck rank is stopped later with SIGTERM."
)


def derive_from_records(accs: Accumulator, records: list[Placed], sigterm_pids: set[int]) -> None:
    """Add ``child_failed`` (every failed worker, and torchrun's first observed failure) and a
    ``killed_by_signal`` per worker that died from a signal; ``sigterm_pids``: torchrun's own SIGTERMs."""
    failed = [(r, s, n) for r, s, n in records if r.exitcode not in (None, 0) or r.message]
    if not failed:
        return
    first = next((r for r, _, _ in failed if r.first_observed), None)
    msg = "launcher reported failed ranks"
    if first is not None:
        msg += f"; first observed failure: rank {first.rank} (exitcode {first.exitcode})"
    facts: dict[str, Any] = {
        "failures": [r.model_dump(exclude_defaults=True) for r, _, _ in failed],
        "failed_ranks": sorted({r.rank for r, _, _ in failed if r.rank is not None}),
        **({"first_observed_rank": first.rank, "first_observed_exitcode": first.exitcode} if first else {}),
    }
    step = NextStep(action="Compare the failed ranks' own errors.", skill_section=SECTIONS["child_failed"])
    fix = "Read the findings of each rank; trust suspect_ranks over the first observed failure."
    draft = Draft("child_failed", "error", "context", msg, _CHILD_FAILED_EXPLANATION, fix, [step], facts)
    accs.add(draft, None, failed[0][1], failed[0][2], msg)
    for rec, source, line_no in failed:
        sig = rec.signal
        if not sig and rec.exitcode is not None and rec.exitcode > 128 and SIGNAME.get(rec.exitcode - 128):
            sig = SIGNAME[rec.exitcode - 128]
        if not sig:
            continue
        severity, explanation, fix = SIGNAL_MEANING.get(sig, ("error", f"The process died from {sig}.", ""))
        sig_facts: dict[str, Any] = {"signal": sig, "exitcode": rec.exitcode, "pid": rec.pid}
        if sig == "SIGTERM" and rec.pid in sigterm_pids:
            sig_facts["sent_by_launcher"] = True
        role: Role = "victim" if sig in ("SIGTERM", "SIGINT") else "cause"
        step = NextStep(
            action="Check the kernel log and memory limits.",
            tool="collect_env",
            skill_section=SECTIONS["killed_by_signal"],
        )
        kept = {k: v for k, v in sig_facts.items() if v is not None}
        draft = Draft("killed_by_signal", severity, role, f"killed by {sig}", explanation, fix, [step], kept)
        accs.add(draft, rec.rank, source, line_no, f"rank {rec.rank} exitcode {rec.exitcode} ({sig})")


def fold_duplicate_gpu(accs: Accumulator) -> None:
    """NCCL's 'invalid usage' error on a rank that printed 'Duplicate GPU detected' is the same failure
    told twice: its lines join the duplicate_gpu finding instead of standing as a second cause."""
    for (kind, rank, source), acc in list(accs.by_key.items()):
        dup = accs.by_key.get(("duplicate_gpu", rank, source))
        if kind != "nccl_error" or dup is None or "invalid usage" not in str(acc.facts.get("reason", "")):
            continue
        del accs.by_key[(kind, rank, source)]
        dup.facts.setdefault("nccl_error", f"{acc.facts['reason']} at {acc.facts.get('where', '?')}")
        dup.lines = sorted({*dup.lines, *acc.lines})[:MAX_LINES_PER_FINDING]


def mark_watchdog_aborts(accs: Accumulator) -> None:
    """A SIGABRT in a job whose watchdog timed out or saw an error is the watchdog's own abort
    (TORCH_NCCL_ASYNC_ERROR_HANDLING): every rank that timed out gets one. Said so, as context."""
    kinds = {k for k, _, _ in accs.by_key} - {"killed_by_signal"}
    if not kinds & WATCHDOG_EVIDENCE:
        return
    for (kind, _, _), acc in accs.by_key.items():
        if kind == "killed_by_signal" and acc.facts.get("signal") == "SIGABRT":
            acc.severity, acc.role = "info", "victim"
            acc.explanation = (
                "NCCL's watchdog aborted this process after the collective timeout or error the log shows "
                "(TORCH_NCCL_ASYNC_ERROR_HANDLING): a consequence, not a cause."
            )
            acc.fix = "Follow the timeout or error, not the abort."


_NOT_A_CAUSE_HERE = frozenset(
    {"exit_without_destroy", "killed_by_signal", "child_failed", "launcher_stopped"}
)
"""Kinds that say how a rank ended, not why: beside them, an exit without destroy may be the cause."""


def explain_exit_aborts(accs: Accumulator) -> None:
    """What the lines about a process group left alive at exit mean, once the whole log is read.

    'terminate called without an active exception' at the end of a run that failed nowhere else is
    the crash: the aborted ranks get the ``exit_without_destroy`` finding (a line without a rank
    prefix names none of its own) and their SIGABRT becomes its consequence, so its fix leads, not
    "check the kernel log". Torch's warning alone says the same of a run that ended well: a warning.
    After another failure (a watchdog timeout, an exception) both only follow it: context."""
    exits = [acc for (kind, _, _), acc in accs.by_key.items() if kind == "exit_without_destroy"]
    if not exits:
        return
    others = [
        acc
        for (kind, _, _), acc in accs.by_key.items()
        if kind not in _NOT_A_CAUSE_HERE and acc.role == "cause" and acc.severity in ("error", "critical")
    ]
    if others or any(k in WATCHDOG_EVIDENCE for k, _, _ in accs.by_key):
        for acc in exits:
            acc.severity, acc.role = "info", "context"
            acc.explanation += " Here it follows the failure the other findings show: fix that one."
        return
    crashed = [acc for acc in exits if any("terminate called" in line for line in acc.excerpt)]
    for acc in exits:
        if acc not in crashed:
            acc.severity, acc.role = "warning", "context"
    if crashed:
        _blame_the_aborted(accs)


def _blame_the_aborted(accs: Accumulator) -> None:
    """Each SIGABRT becomes the exit abort's consequence; an unranked exit line takes the one aborted rank."""
    aborted = [
        acc
        for (kind, _, _), acc in accs.by_key.items()
        if kind == "killed_by_signal" and acc.facts.get("signal") == "SIGABRT"
    ]
    unranked = [k for k in accs.by_key if k[0] == "exit_without_destroy" and k[1] is None]
    ranks = sorted({acc.rank for acc in aborted if acc.rank is not None})
    if len(unranked) == 1 and len(ranks) == 1:
        acc = accs.by_key.pop(unranked[0])
        acc.rank = ranks[0]
        accs.by_key.setdefault(("exit_without_destroy", ranks[0], acc.source), acc)
    for acc in aborted:
        acc.severity, acc.role = "info", "victim"
        acc.explanation = (
            "The abort at exit that 'terminate called without an active exception' shows: the process group "
            "was never destroyed (finding exit_without_destroy)."
        )
        acc.fix = EXIT_WITHOUT_DESTROY_FIX
