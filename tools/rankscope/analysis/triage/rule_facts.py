"""What one matching log line says: a rule's facts from the line, and its wording for those facts.

A rule's regex gives raw facts; some kinds need more to be useful: a signal's name and what it
means, an Xid's meaning, an OOM's sizes in bytes, the kernel and assertion of a device-side assert,
the two ranks sharing a GPU. Each is a pure function of the rule, the line and its facts, so the
scanner only decides which rank a line belongs to and accumulates the ``Draft`` it gets back.
"""

from __future__ import annotations

import re
from typing import Any

from rankscope.analysis.triage.accumulator import Draft
from rankscope.analysis.triage.log_rules import ASSERT_CUDA_ERROR, SIGNAL_MEANING, XID_MEANING, Rule
from rankscope.analysis.units import size_or_none

_PG_RANK = re.compile(
    r"\[(?:PG ID (?P<pg_id>\d+) PG GUID (?P<pg_guid>[^\]]*?) |PG (?P<pg>\d+) )?Rank (?P<rank>\d+)\]"
)
_TRACED_KINDS = frozenset(
    {"cuda_error", "cuda_oom", "nccl_error", "duplicate_gpu", "collective_mismatch", "unused_parameters"}
)
"""Kinds whose finding takes the innermost user frame of the traceback printed with it (facts.call_site)."""
_OOM_SIZES = ("requested", "total_capacity", "free", "allocated_by_pytorch", "reserved_unallocated")


def facts_from(m: re.Match[str]) -> dict[str, Any]:
    """A match's named groups as facts: numbers as ints, except ids that only look like numbers."""
    facts: dict[str, Any] = {}
    for key, value in m.groupdict().items():
        if value is None:
            continue
        value = value.strip()
        if re.fullmatch(r"-?\d+", value) and key not in ("pci", "pg_guid", "nccl_version", "bus_id"):
            facts[key] = int(value)
        else:
            facts[key] = value
    return facts


def line_facts(rule: Rule, text: str) -> dict[str, Any] | None:
    """The facts ``rule`` reads from ``text``; None when the line is not the rule's after all
    (its regex must match and does not, or another rule says it better)."""
    if rule.kind == "rendezvous_failure" and "EADDRINUSE" in text:
        return None  # the port is taken: address_in_use says it better
    if rule.kind == "peer_closed" and text.lstrip().startswith("ConnectionResetError"):
        return None  # a Python socket (multiprocessing, DataLoader fd passing), not a collective peer
    if rule.kind == "nccl_error" and "Duplicate GPU detected" in text:
        return None  # duplicate_gpu names it with the right fix
    facts: dict[str, Any] = {}
    if rule.pattern is not None:
        m = rule.pattern.search(text)
        if m is None and rule.require_match:
            return None
        if m is not None:
            facts = facts_from(m)
    if rule.kind == "collective_timeout":
        pm = _PG_RANK.search(text)
        if pm is not None:
            for k, v in facts_from(pm).items():
                facts.setdefault(k, v)
    return facts


_RAISED = re.compile(r"^\s*[A-Za-z_][\w.]*(?:Error|Exception)\w*: ")


def takes_call_site(rule: Rule, text: str = "") -> bool:
    """Whether a finding of ``rule`` names the user frame it was raised from (not for warnings). A
    collective's timeout does when its line is the exception that ends a traceback (gloo's, or a
    blocking wait's), never for the watchdog's own lines, which no traceback of the rank precedes."""
    if rule.kind == "collective_timeout":
        return _RAISED.match(text) is not None
    return rule.kind in _TRACED_KINDS and rule.severity != "warning"


def shaped(rule: Rule, text: str, facts: dict[str, Any], rank: int | None) -> Draft:
    """The finding ``rule`` makes of ``text``: its wording for these facts, which it completes in place."""
    d = Draft(
        kind=rule.kind,
        severity=rule.severity,
        role=rule.role,
        message=rule.message,
        explanation=rule.explanation,
        fix=rule.fix,
        next_steps=list(rule.next_steps),
        facts=facts,
    )
    if rule.kind == "killed_by_signal":
        _signal(d)
    elif rule.kind == "gpu_xid" and isinstance(facts.get("xid"), int):
        facts["meaning"] = XID_MEANING.get(facts["xid"], "See NVIDIA's Xid catalog for this code.")
        d.message = f"GPU Xid {facts['xid']}"
    elif rule.kind == "cuda_oom":
        _oom_bytes(facts)
    elif rule.kind == "cuda_error" and "device-side assert" in text:
        d.fix = ASSERT_CUDA_ERROR[0]
        d.next_steps = list(ASSERT_CUDA_ERROR[1])
    elif rule.kind in ("device_assert", "duplicate_gpu", "thread_died"):
        d.message = special_message(rule.kind, facts, rank)
    elif rule.kind == "nccl_error" and "warning" in facts:
        warning = str(facts["warning"])
        if "Cuda failure" in warning or "cuda" in warning.lower():
            d.message = "NCCL warning: CUDA failure"
    return d


def _signal(d: Draft) -> None:
    """Name the signal (a crash message and the OOM killer imply theirs) and say what it means."""
    facts = d.facts
    sig = facts.pop("signal2", None) or facts.get("signal")
    crash = facts.pop("crash", None)
    if crash:
        sig = "SIGSEGV" if crash.startswith("Seg") else "SIGBUS"
    if facts.get("oom_pid"):
        sig = "SIGKILL"
        facts["oom_killer"] = True
    if sig:
        facts["signal"] = sig
        d.severity, d.explanation, d.fix = SIGNAL_MEANING.get(sig, (d.severity, d.explanation, d.fix))
        d.message = f"killed by {sig}"


def _oom_bytes(facts: dict[str, Any]) -> None:
    """Add ``<size>_bytes`` beside each size an OOM message printed (``2.00 GiB``)."""
    for key in _OOM_SIZES:
        if isinstance(facts.get(key), str):
            size = size_or_none(facts[key])
            if size is not None:
                facts[f"{key}_bytes"] = size


def special_message(kind: str, facts: dict[str, Any], rank: int | None) -> str:
    """The one-line message of a device assert, a shared GPU or a dead thread, from its facts."""
    if kind == "device_assert":
        reason = re.search(r'"([^"]+)"', str(facts.get("assertion", "")))
        if reason:
            facts["reason"] = reason.group(1)
        name = str(facts.get("kernel_file", "?")).rsplit("/", 1)[-1]
        facts["kernel_site"] = f"{name}:{facts.get('kernel_line', '?')} {facts.get('kernel', '')}".strip()
        return f"device-side assert in {facts['kernel_site']}: `{facts.get('assertion', '')}` failed"
    if kind == "duplicate_gpu":
        other = facts.get("other_rank")
        me = rank if rank is not None else facts.get("rank")
        return (
            f"ranks {me} and {other} on one GPU (bus id {facts.get('bus_id', '?')}): Duplicate GPU detected"
        )
    return f"thread {facts.get('thread', '?')} died"
