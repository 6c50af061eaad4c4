"""Log triage, pure: lines in, findings and a root-cause verdict out.

``LogScanner`` consumes lines one at a time (with their source, line number and
a rank hint from the file name) and keeps only bounded state: one accumulating
finding per (kind, rank, source), torchrun's failure table, and a pid→rank map
from NCCL's init lines. ``conclude`` reasons across the findings: ranks that
report a closed peer or wait in a timed-out collective are victims; the rank
that lags, stays silent, runs out of memory or is killed is the suspect.
torchrun's "first observed failure" is only evidence: the first rank to fail is
often a victim that timed out first.

No I/O here: the shell (``rankscope.capabilities.triage``) reads files and passes lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankscope.analysis.ranges import rank_ranges, ranks_phrase
from rankscope.analysis.triage.log_rules import (
    ALL_NEEDLES,
    ASSERT_CUDA_ERROR,
    RULES,
    SECTIONS,
    SIGNAL_MEANING,
    XID_MEANING,
    Role,
    Rule,
)
from rankscope.analysis.units import size_or_none
from rankscope.models.core import Finding, NextStep, Severity
from rankscope.models.logs import FailureRecord

_RANK_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:")
_NCCL_COMM = re.compile(
    r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\] NCCL INFO comm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
)
_NCCL_LINE = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\] (?:\S+:\d+ )?NCCL ")
_TORCHRUN_FAILED = re.compile(
    r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\)"
)
_SPAWN_EXIT = re.compile(r"process (?P<rank>\d+) terminated with exit code (?P<exitcode>-?\d+)")
_CLOSING = re.compile(r"Sending process (?P<pid>\d+) closing signal (?P<signal>SIG\w+)")
_TABLE_FIELD = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_TABLE_RANK = re.compile(r"(?P<rank>-?\d+|<N/A>)(?: \(local_rank: (?P<local_rank>-?\d+|<N/A>)\))?")
_TABLE_EXIT = re.compile(r"(?P<exitcode>-?\d+) \(pid: (?P<pid>\d+)\)\s*(?:\((?P<signal>SIG\w+)\))?")
_PG_RANK = re.compile(
    r"\[(?:PG ID (?P<pg_id>\d+) PG GUID (?P<pg_guid>[^\]]*?) |PG (?P<pg>\d+) )?Rank (?P<rank>\d+)\]"
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S.*?)\s*$')
_EXCEPTION_LINE = re.compile(
    r"^(?P<exception>[A-Za-z_][\w.]*(?:Error|Exception)\w*)(?:: (?P<exc_message>.*))?$"
)
_LIBRARY_FILES = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ", "/torch/")
_TRACE_SPAN = 60
"""A user frame more than this many lines before an error is not that error's traceback."""
_TRACED_KINDS = frozenset(
    {"cuda_error", "cuda_oom", "nccl_error", "duplicate_gpu", "collective_mismatch", "unused_parameters"}
)
"""Kinds whose finding takes the innermost user frame of the traceback printed with it (facts.call_site)."""
_SIGNUM = {
    "SIGHUP": 1,
    "SIGINT": 2,
    "SIGQUIT": 3,
    "SIGILL": 4,
    "SIGABRT": 6,
    "SIGBUS": 7,
    "SIGFPE": 8,
    "SIGKILL": 9,
    "SIGSEGV": 11,
    "SIGPIPE": 13,
    "SIGALRM": 14,
    "SIGTERM": 15,
}
_SIGNAME = {v: k for k, v in _SIGNUM.items()}

TABLE_NEEDLES: tuple[str, ...] = (
    "Root Cause (first observed failure)",
    "Failures:",
    "time      :",
    "host      :",
    "rank      :",
    "exitcode  :",
    "error_file:",
    "traceback :",
    "failed (exitcode:",
    "closing signal",
    "terminated with exit code",
    " NCCL INFO comm ",
    'File "',
    "Traceback (most recent call last)",
    "(most recent call first)",
    "Error",
    "Exception",
)
NEEDLES: tuple[str, ...] = tuple(dict.fromkeys(ALL_NEEDLES + TABLE_NEEDLES))
"""Every literal that can make a line interesting; lines without any are skipped."""
TABLE_END = "====="
SHELL_NEEDLES: tuple[str, ...] = (*NEEDLES, TABLE_END)
"""What a shell pre-filtering lines must pass to ``feed``: the needles and the end of torchrun's table."""

_SEVERITY_ORDER: dict[str, int] = {"critical": 0, "error": 1, "warning": 2, "info": 3}
_ROLE_ORDER: dict[str, int] = {"cause": 0, "context": 1, "victim": 2}
_MAX_LINES_PER_FINDING = 8
_EXCERPT_CHARS = 600


parse_size = size_or_none  # sizes as PyTorch prints them ("2.00 GiB"); None when not a size


def _facts_from(m: re.Match[str]) -> dict[str, Any]:
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


def _oom_bytes(facts: dict[str, Any]) -> None:
    """Add ``<size>_bytes`` beside each size an OOM message printed (``2.00 GiB``)."""
    for key in ("requested", "total_capacity", "free", "allocated_by_pytorch", "reserved_unallocated"):
        if isinstance(facts.get(key), str):
            size = parse_size(facts[key])
            if size is not None:
                facts[f"{key}_bytes"] = size


@dataclass
class _Acc:
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


@dataclass
class _Table:
    """torchrun's ChildFailedError table while it is being read."""

    source: str
    first_observed: bool = False
    current: dict[str, str] = field(default_factory=dict)
    line: int = 0


class LogScanner:
    """Streaming rule engine: ``feed`` lines, then ``findings()`` and ``failures()``."""

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        self._redact = redact or (lambda s: s)
        self._accs: dict[tuple[str, int | None, str], _Acc] = {}
        self._order = 0
        self._table: _Table | None = None
        self._records: list[tuple[FailureRecord, str, int]] = []
        self._torchrun_failed: list[tuple[FailureRecord, str, int]] = []
        self._sigterm_pids: set[int] = set()
        self._pid_rank: dict[tuple[str, int], tuple[int, int]] = {}
        self.seen_ranks: set[int] = set()
        self.world_size: int | None = None
        self._frames: dict[tuple[str, int | None], tuple[int, str]] = {}
        self._threads: dict[tuple[str, int | None], tuple[str, int | None, str]] = {}
        self.stack_sources: set[str] = set()
        """Sources that hold faulthandler stacks ("most recent call first"): saved stacks as well as logs."""

    # -- input -----------------------------------------------------------------------------------------
    def feed(self, line: str, line_no: int, source: str, rank_hint: int | None = None) -> None:
        """Consume one line (without its newline). Lines without any needle cost one scan."""
        if self._table is not None and TABLE_END in line and line.strip().startswith(TABLE_END):
            self._close_table()
            return
        if not any(n in line for n in NEEDLES):
            return
        rank = rank_hint
        text = line
        m = _RANK_PREFIX.match(line)
        if m:
            rank = int(m.group(1))
            text = line[m.end() :]
        if rank is not None:
            self.seen_ranks.add(rank)
        if self._table_line(text, line_no, source):
            return
        if self._torchrun_line(text, line_no, source):
            return
        if self._traceback_line(text, line_no, source, rank):
            return
        nm = _NCCL_LINE.search(text)
        if nm and rank is None:
            known = self._pid_rank.get((nm["host"], int(nm["pid"])))
            if known:
                rank = known[0]
        for rule in RULES:
            if any(n in text for n in rule.needles):
                self._apply(rule, text, line_no, source, rank)

    def _traceback_line(self, text: str, line_no: int, source: str, rank: int | None) -> bool:
        """Follow Python tracebacks: the innermost user frame (for facts.call_site) and the exception
        that ends a dead thread's traceback. True when the line is a traceback line and nothing more."""
        key = (source, rank)
        if "(most recent call first)" in text:
            self.stack_sources.add(source)
            return True
        if "Traceback (most recent call last)" in text:
            self._frames.pop(key, None)
            return True
        fm = _FRAME.match(text)
        if fm is not None:
            if not any(part in fm["file"] for part in _LIBRARY_FILES):
                self._frames[key] = (line_no, f"{fm['file']}:{fm['line']} in {fm['func']}")
            return True
        thread = self._threads.get(key)
        em = _EXCEPTION_LINE.match(text.strip()) if thread is not None else None
        if thread is not None and em is not None:
            del self._threads[key]
            acc = self._accs.get(("thread_died", thread[1], source))
            if acc is not None:
                acc.facts.setdefault("exception", em["exception"])
                if em["exc_message"]:
                    acc.facts.setdefault("exception_message", self._redact(em["exc_message"].strip())[:300])
                site = self.call_site(source, rank, line_no)
                if site:
                    acc.facts.setdefault("call_site", site)
                acc.message = f"thread {thread[0]} died: {self._redact(text.strip())[:200]}"
                acc.lines.append(line_no)
                acc.excerpt.append(self._redact(text.strip())[:_EXCERPT_CHARS])
        return False

    def call_site(self, source: str, rank: int | None, line_no: int) -> str | None:
        """The innermost user frame of the traceback just printed on this rank, if recent enough."""
        seen = self._frames.get((source, rank))
        return seen[1] if seen is not None and line_no - seen[0] <= _TRACE_SPAN else None

    def add_failure(self, record: FailureRecord, source: str, line_no: int = 0) -> None:
        """A failure record read from a torchelastic error.json by the shell."""
        self._records.append((record, source, line_no))
        if record.rank is not None:
            self.seen_ranks.add(record.rank)

    def _apply(self, rule: Rule, text: str, line_no: int, source: str, rank: int | None) -> None:
        if rule.kind == "rendezvous_failure" and "EADDRINUSE" in text:
            return  # the port is taken: address_in_use says it better
        if rule.kind == "peer_closed" and text.lstrip().startswith("ConnectionResetError"):
            return  # a Python socket (multiprocessing, DataLoader fd passing), not a collective peer
        if rule.kind == "nccl_error" and "Duplicate GPU detected" in text:
            return  # duplicate_gpu names it with the right fix
        facts: dict[str, Any] = {}
        if rule.pattern is not None:
            m = rule.pattern.search(text)
            if m is None and rule.require_match:
                return
            if m is not None:
                facts = _facts_from(m)
        if rule.kind == "collective_timeout":
            pm = _PG_RANK.search(text)
            if pm is not None:
                for k, v in _facts_from(pm).items():
                    facts.setdefault(k, v)
        if rank is None and isinstance(facts.get("rank"), int):
            rank = facts["rank"]
        if rank is not None:
            self.seen_ranks.add(rank)
        if isinstance(facts.get("other_rank"), int):
            self.seen_ranks.add(facts["other_rank"])
        facts.pop("rank", None)
        severity: Severity = rule.severity
        explanation, fix = rule.explanation, rule.fix
        message = rule.message
        next_steps = list(rule.next_steps)
        if rule.kind in _TRACED_KINDS and rule.severity != "warning":
            site = self.call_site(source, rank, line_no)
            if site:
                facts.setdefault("call_site", site)
        if rule.kind == "killed_by_signal":
            sig = facts.pop("signal2", None) or facts.get("signal")
            crash = facts.pop("crash", None)
            if crash:
                sig = "SIGSEGV" if crash.startswith("Seg") else "SIGBUS"
            if facts.get("oom_pid"):
                sig = "SIGKILL"
                facts["oom_killer"] = True
            if sig:
                facts["signal"] = sig
                severity, explanation, fix = SIGNAL_MEANING.get(sig, (severity, explanation, fix))
                message = f"killed by {sig}"
        elif rule.kind == "gpu_xid" and isinstance(facts.get("xid"), int):
            facts["meaning"] = XID_MEANING.get(facts["xid"], "See NVIDIA's Xid catalog for this code.")
            message = f"GPU Xid {facts['xid']}"
        elif rule.kind == "cuda_oom":
            _oom_bytes(facts)
        elif rule.kind == "cuda_error" and "device-side assert" in text:
            fix = ASSERT_CUDA_ERROR[0]
            next_steps = list(ASSERT_CUDA_ERROR[1])
        elif rule.kind in ("device_assert", "duplicate_gpu", "thread_died"):
            message = self._special_message(rule.kind, facts, message, rank)
            if rule.kind == "thread_died":
                self._threads[(source, rank)] = (str(facts.get("thread", "?")), rank, text)
        elif rule.kind == "nccl_error" and "warning" in facts:
            warning = str(facts["warning"])
            if "Cuda failure" in warning or "cuda" in warning.lower():
                message = "NCCL warning: CUDA failure"
        self._add(
            rule.kind,
            severity,
            rule.role,
            rank,
            source,
            line_no,
            text,
            message,
            explanation,
            fix,
            next_steps,
            facts,
        )

    @staticmethod
    def _special_message(kind: str, facts: dict[str, Any], message: str, rank: int | None) -> str:
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
            return f"ranks {me} and {other} on one GPU (bus id {facts.get('bus_id', '?')}): Duplicate GPU detected"
        return f"thread {facts.get('thread', '?')} died"

    def _add(
        self,
        kind: str,
        severity: Severity,
        role: Role,
        rank: int | None,
        source: str,
        line_no: int,
        text: str,
        message: str,
        explanation: str,
        fix: str,
        next_steps: list[NextStep],
        facts: dict[str, Any],
    ) -> None:
        key = (kind, rank, source)
        acc = self._accs.get(key)
        if acc is None:
            self._order += 1
            acc = _Acc(
                kind=kind,
                severity=severity,
                role=role,
                rank=rank,
                source=source,
                message=message,
                explanation=explanation,
                fix=fix,
                next_steps=next_steps,
                first_line=line_no,
                order=self._order,
            )
            self._accs[key] = acc
        elif _SEVERITY_ORDER[severity] < _SEVERITY_ORDER[acc.severity]:
            acc.severity, acc.explanation, acc.fix, acc.message = severity, explanation, fix, message
        acc.count += 1
        for k, v in facts.items():
            acc.facts.setdefault(k, v)
        if len(acc.lines) < _MAX_LINES_PER_FINDING:
            acc.lines.append(line_no)
            if sum(len(e) for e in acc.excerpt) < _EXCERPT_CHARS:
                acc.excerpt.append(self._redact(text.strip())[:_EXCERPT_CHARS])

    # -- torchrun's own lines ------------------------------------------------------------------------------
    def _table_line(self, text: str, line_no: int, source: str) -> bool:
        stripped = text.strip()
        if stripped.startswith("Root Cause (first observed failure)") or stripped == "Failures:":
            self._flush_entry()
            if self._table is None or self._table.source != source:
                self._table = _Table(source=source)
            self._table.first_observed = stripped.startswith("Root Cause")
            return True
        if self._table is None:
            return False
        m = _TABLE_FIELD.match(text)
        if m is None:
            return False
        if m["key"] == "time":
            self._flush_entry()
            self._table.line = line_no
        self._table.current[m["key"]] = m["value"].strip()
        if m["key"] == "traceback":
            self._flush_entry()
        return True

    def _flush_entry(self) -> None:
        table = self._table
        if table is None or not table.current:
            return
        cur, table.current = table.current, {}
        rec = FailureRecord(
            first_observed=table.first_observed,
            time=cur.get("time"),
            host=cur.get("host"),
            error_file=cur.get("error_file"),
            message=self._redact(cur.get("traceback", ""))[:_EXCERPT_CHARS],
        )
        rm = _TABLE_RANK.match(cur.get("rank", ""))
        if rm:
            rec.rank = int(rm["rank"]) if rm["rank"].lstrip("-").isdigit() else None
            lr = rm["local_rank"]
            rec.local_rank = int(lr) if lr and lr.lstrip("-").isdigit() else None
        em = _TABLE_EXIT.match(cur.get("exitcode", ""))
        if em:
            rec.exitcode = int(em["exitcode"])
            rec.pid = int(em["pid"])
            rec.signal = em["signal"] or (_SIGNAME.get(-rec.exitcode) if rec.exitcode < 0 else None)
        self._records.append((rec, table.source, table.line))
        if rec.rank is not None:
            self.seen_ranks.add(rec.rank)

    def _close_table(self) -> None:
        self._flush_entry()
        self._table = None

    def _torchrun_line(self, text: str, line_no: int, source: str) -> bool:
        m = _TORCHRUN_FAILED.search(text)
        if m:
            code = int(m["exitcode"])
            rec = FailureRecord(
                rank=None,
                local_rank=int(m["local_rank"]),
                pid=int(m["pid"]),
                exitcode=code,
                signal=_SIGNAME.get(-code) if code < 0 else None,
                message=self._redact(text.strip())[:300],
            )
            self._torchrun_failed.append((rec, source, line_no))
            return True
        m = _CLOSING.search(text)
        if m:
            self._sigterm_pids.add(int(m["pid"]))
            return True
        m = _SPAWN_EXIT.search(text)
        if m:
            rec = FailureRecord(
                rank=int(m["rank"]), exitcode=int(m["exitcode"]), message=self._redact(text.strip())[:300]
            )
            self._records.append((rec, source, line_no))
            self.seen_ranks.add(rec.rank or 0)
            return True
        m = _NCCL_COMM.search(text)
        if m:
            key = (m["host"], int(m["pid"]))
            rank, nranks = int(m["rank"]), int(m["nranks"])
            old = self._pid_rank.get(key)
            if old is None or nranks > old[1]:
                self._pid_rank[key] = (rank, nranks)
            self.world_size = max(self.world_size or 0, nranks)
            return True
        return False

    # -- output ----------------------------------------------------------------------------------------------
    def failures(self) -> list[FailureRecord]:
        self._close_table()
        records = [r for r, _, _ in self._records]
        if not any(r.exitcode is not None and r.rank is not None for r in records):
            # No table (log cut short): fall back to torchrun's "failed (exitcode...)" lines; on one node the
            # local rank is the global rank.
            for rec, _, _ in self._torchrun_failed:
                records.append(rec.model_copy(update={"rank": rec.local_rank}))
        return records

    def findings(self) -> list[Finding]:
        """Every accumulated finding, plus those derived from failure records; most important first."""
        self._close_table()
        records = list(self._records)
        if not any(r.exitcode is not None and r.rank is not None for r, _, _ in records):
            records += [
                (r.model_copy(update={"rank": r.local_rank}), s, n) for r, s, n in self._torchrun_failed
            ]
        self._derive_from_records(records)
        self._fold_duplicate_gpu()
        self._mark_watchdog_aborts()
        accs = sorted(
            self._accs.values(), key=lambda a: (_ROLE_ORDER[a.role], _SEVERITY_ORDER[a.severity], a.order)
        )
        out: list[Finding] = []
        for a in accs:
            facts = dict(a.facts)
            if a.count > 1:
                facts["occurrences"] = a.count
            out.append(
                Finding(
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
            )
        return out

    def _mark_watchdog_aborts(self) -> None:
        """A SIGABRT in a job whose watchdog timed out or saw an error is the watchdog's own abort
        (TORCH_NCCL_ASYNC_ERROR_HANDLING): every rank that timed out gets one. Said so, as context."""
        kinds = {k for k, _, _ in self._accs} - {"killed_by_signal"}
        if not kinds & _WATCHDOG_EVIDENCE:
            return
        for (kind, _, _), acc in self._accs.items():
            if kind == "killed_by_signal" and acc.facts.get("signal") == "SIGABRT":
                acc.severity, acc.role = "info", "victim"
                acc.explanation = (
                    "NCCL's watchdog aborted this process after the collective timeout or error the log shows "
                    "(TORCH_NCCL_ASYNC_ERROR_HANDLING): a consequence, not a cause."
                )
                acc.fix = "Follow the timeout or error, not the abort."

    def _fold_duplicate_gpu(self) -> None:
        """NCCL's 'invalid usage' error on a rank that printed 'Duplicate GPU detected' is the same failure
        told twice: its lines join the duplicate_gpu finding instead of standing as a second cause."""
        for (kind, rank, source), acc in list(self._accs.items()):
            dup = self._accs.get(("duplicate_gpu", rank, source))
            if kind != "nccl_error" or dup is None or "invalid usage" not in str(acc.facts.get("reason", "")):
                continue
            del self._accs[(kind, rank, source)]
            dup.facts.setdefault("nccl_error", f"{acc.facts['reason']} at {acc.facts.get('where', '?')}")
            dup.lines = sorted({*dup.lines, *acc.lines})[:_MAX_LINES_PER_FINDING]

    def _derive_from_records(self, records: list[tuple[FailureRecord, str, int]]) -> None:
        failed = [(r, s, n) for r, s, n in records if r.exitcode not in (None, 0) or r.message]
        if not failed:
            return
        first = next((r for r, _, _ in failed if r.first_observed), None)
        src = failed[0][1]
        line = failed[0][2]
        table = [r.model_dump(exclude_defaults=True) for r, _, _ in failed]
        ranks = sorted({r.rank for r, _, _ in failed if r.rank is not None})
        msg = "launcher reported failed ranks"
        if first is not None:
            msg += f"; first observed failure: rank {first.rank} (exitcode {first.exitcode})"
        self._add(
            "child_failed",
            "error",
            "context",
            None,
            src,
            line,
            msg,
            msg,
            "torchrun (or the spawn parent) lists every failed local worker and calls the earliest one the "
            "'Root Cause (first observed failure)'. It is only the first to exit: a rank that timed out waiting "
            "for a stuck peer exits first and gets named, while the stuck rank is stopped later with SIGTERM.",
            "Read the findings of each rank; trust suspect_ranks over the first observed failure.",
            [
                NextStep(
                    action="Compare the failed ranks' own errors.", skill_section=SECTIONS["child_failed"]
                )
            ],
            {
                "failures": table,
                "failed_ranks": ranks,
                **(
                    {"first_observed_rank": first.rank, "first_observed_exitcode": first.exitcode}
                    if first
                    else {}
                ),
            },
        )
        for rec, source, line_no in failed:
            sig = rec.signal
            if (
                not sig
                and rec.exitcode is not None
                and rec.exitcode > 128
                and _SIGNAME.get(rec.exitcode - 128)
            ):
                sig = _SIGNAME[rec.exitcode - 128]
            if not sig:
                continue
            severity, explanation, fix = SIGNAL_MEANING.get(
                sig, ("error", f"The process died from {sig}.", "")
            )
            facts: dict[str, Any] = {"signal": sig, "exitcode": rec.exitcode, "pid": rec.pid}
            if sig == "SIGTERM" and rec.pid in self._sigterm_pids:
                facts["sent_by_launcher"] = True
            role: Role = "victim" if sig in ("SIGTERM", "SIGINT") else "cause"
            self._add(
                "killed_by_signal",
                severity,
                role,
                rec.rank,
                source,
                line_no,
                f"rank {rec.rank} exitcode {rec.exitcode} ({sig})",
                f"killed by {sig}",
                explanation,
                fix,
                [
                    NextStep(
                        action="Check the kernel log and memory limits.",
                        tool="collect_env",
                        skill_section=SECTIONS["killed_by_signal"],
                    )
                ],
                {k: v for k, v in facts.items() if v is not None},
            )


# -- reasoning across findings --------------------------------------------------------------------------------

_CAUSE_KINDS = (
    "gpu_xid",
    "duplicate_gpu",
    "device_assert",
    "cuda_oom",
    "cuda_error",
    "thread_died",
    "killed_by_signal",
    "dataloader_worker_killed",
    "shm_exhausted",
    "nccl_error",
    "collective_mismatch",
    "unused_parameters",
)
_WATCHDOG_EVIDENCE = frozenset(
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


@dataclass
class Conclusion:
    suspect_ranks: list[int]
    victim_ranks: list[int]
    summary: str
    evidence: list[str]
    next_steps: list[NextStep]


def _by_rank(findings: Iterable[Finding], kind: str) -> dict[int, Finding]:
    out: dict[int, Finding] = {}
    for f in findings:
        if f.kind == kind:
            for r in f.ranks:
                out.setdefault(r, f)
    return out


def _on_pg0(f: Finding) -> bool:
    return f.facts.get("pg_id", f.facts.get("pg", 0)) in (0, "0", None)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _work(f: Finding) -> str:
    """``ALLREDUCE NumelIn=65536`` (NumelOut only when it differs): what a rank's timed-out work was."""
    op = str(f.facts.get("op") or "work")
    n_in, n_out = f.facts.get("numel_in"), f.facts.get("numel_out")
    size = (
        ""
        if n_in is None
        else f" NumelIn={n_in}" + (f", NumelOut={n_out}" if n_out not in (None, n_in) else "")
    )
    return op + size


def _work_contrast(timeouts: dict[int, Finding]) -> dict[int, str]:
    """Ranks whose timed-out work differs (op or size) from the most ranks' at the same sequence number."""
    by_seq: dict[int, dict[str, list[int]]] = {}
    for r, f in timeouts.items():
        seq = _int(f.facts.get("seq"))
        if seq is not None and f.facts.get("op"):
            by_seq.setdefault(seq, {}).setdefault(_work(f), []).append(r)
    out: dict[int, str] = {}
    for seq, groups in by_seq.items():
        if len(groups) < 2:
            continue
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
        if len(ordered[0][1]) == len(ordered[1][1]):
            continue  # a tie: no majority to call the others odd
        common, most = ordered[0]
        for work, ranks in ordered[1:]:
            for r in ranks:
                out[r] = f"waits at #{seq} in {work} where {ranks_phrase(sorted(most))} wait in {common}"
    return out


def _lag(timeouts: dict[int, Finding]) -> dict[int, str]:
    """Timed-out ranks whose last enqueued work is behind the others': they issued fewer collectives
    (skipped some, or stopped issuing on the CPU) while the others went on past the stuck one."""
    enqueued = {r: e for r, f in timeouts.items() if (e := _int(f.facts.get("last_enqueued"))) is not None}
    if len(enqueued) < 2:
        return {}
    top = max(enqueued.values())
    ahead = sorted(r for r, e in enqueued.items() if e == top)
    return {
        r: (
            f"enqueued {top - e} fewer collective{'s' if top - e > 1 else ''} than {ranks_phrase(ahead)} "
            f"(last enqueued #{e}, theirs #{top})"
        )
        for r, e in enqueued.items()
        if e < top
    }


def _timeout_roles(
    findings: list[Finding], seen: set[int], peer: set[int], blame_silent: bool = True
) -> list[tuple[int, str, bool]]:
    """(rank, why, suspect?) from the NCCL watchdog's lines, per skill/communication-errors.md#collective-timeout.

    Per rank the watchdog prints the timed-out work (SeqNum, OpType, NumelIn/Out) and how far the rank
    got (last enqueued, last completed). A rank whose last enqueued work is behind the others' issued
    fewer collectives (it skipped some, or stopped issuing); a rank whose work at the same sequence
    number has another op or size called something else there. Ranks that time out on the same work
    with the same counts are victims. S is the highest sequence number a rank timed out on; a rank that
    reported no timeout is a suspect unless its dump-signal line shows it issued S (or, with
    ``blame_silent`` false, because another rank already failed on its own).
    """
    every = _by_rank(findings, "collective_timeout")
    timeouts = {r: f for r, f in every.items() if "barrier_ranks" not in f.facts}
    if not timeouts:
        return []
    signals = _by_rank(findings, "fr_dump_signal")
    seqs = [s for f in timeouts.values() if (s := _int(f.facts.get("seq"))) is not None]
    failing = max(seqs) if seqs else None
    lag, contrast = _lag(timeouts), _work_contrast(timeouts)
    out: list[tuple[int, str, bool]] = []
    for r, f in sorted(timeouts.items()):
        e = _int(f.facts.get("last_enqueued"))
        reasons = [x for x in (lag.get(r), contrast.get(r)) if x]
        if not reasons and failing is not None and e is not None and e < failing:
            reasons.append(f"its last enqueued collective is #{e}, below #{failing} the others timed out on")
        if reasons:
            out.append((r, "; ".join(reasons), True))
        else:
            out.append((r, "timed out waiting in a collective (a victim)", False))
    comparable = failing is not None and all(_on_pg0(f) for f in timeouts.values())
    for r in sorted(seen - set(every) - peer):
        e = _int(signals[r].facts.get("last_enqueued")) if r in signals else None
        if comparable and e is not None and failing is not None:
            if e < failing:
                out.append((r, f"never issued collective #{failing}: its last enqueued work is #{e}", True))
            else:
                out.append(
                    (r, f"issued collective #{failing} (last enqueued #{e}) and did not time out yet", False)
                )
        elif blame_silent:
            out.append((r, "reported no collective timeout while its peers waited for it", True))
    return out


def _same_work_note(findings: list[Finding]) -> str | None:
    """When every rank timed out on the same work with the same counts: nobody lagged on the CPU."""
    timeouts = {
        r: f for r, f in _by_rank(findings, "collective_timeout").items() if "barrier_ranks" not in f.facts
    }
    if len(timeouts) < 2:
        return None
    keys = {
        (f.facts.get("seq"), _work(f), f.facts.get("last_enqueued"), f.facts.get("last_completed"))
        for f in timeouts.values()
    }
    if len(keys) != 1:
        return None
    seq, work, enqueued, _ = next(iter(keys))
    counts = f" with the same last enqueued #{enqueued}" if enqueued is not None else ""
    return (
        f"{ranks_phrase(sorted(timeouts))} timed out in the same {work} #{seq}{counts}: no rank fell behind "
        "on the CPU, so the logs name no suspect; the collective stalled on a GPU (busy with earlier work) "
        "or the network: the flight recorder's states (TORCH_NCCL_ENABLE_TIMING=1) or the stacks tell which"
    )


def _barrier_named(findings: list[Finding]) -> list[tuple[int, str]]:
    """Ranks that rank 0's monitored barrier (TORCH_DISTRIBUTED_DEBUG=DETAIL, gloo) names as not arriving."""
    out: list[tuple[int, str]] = []
    for f in findings:
        named = f.facts.get("barrier_ranks") if f.kind == "collective_timeout" else None
        if named is None:
            continue
        reporter = f"rank {f.ranks[0]}" if f.ranks else "rank 0"
        for part in str(named).split(","):
            if part.strip().isdigit():
                out.append((int(part), f"did not reach the monitored barrier ({reporter} names it)"))
    return out


def _consequence(f: Finding, kinds: set[str]) -> str | None:
    """Why a kill signal is a consequence, not a cause; None when it may be a cause."""
    if f.kind != "killed_by_signal":
        return None
    sig = f.facts.get("signal")
    if sig in ("SIGTERM", "SIGINT"):
        return f"stopped by {sig} (a victim)"
    if sig == "SIGABRT" and kinds & _WATCHDOG_EVIDENCE:
        return "aborted (SIGABRT) by NCCL's watchdog after a timeout or an error: a consequence, not a cause"
    return None


def _first_observed(first: FailureRecord, victims: set[int]) -> tuple[str, bool]:
    """What torchrun's "first observed failure" says (the first rank to exit), and whether it may be blamed."""
    how = f"exitcode {first.exitcode}" + (f", {first.signal}" if first.signal else "")
    line = f"torchrun named rank {first.rank} as the first observed failure ({how}): the first to exit"
    if first.rank in victims:
        return line + "; a victim that gave up waiting", False
    return line + ", not necessarily the cause", True


def _conclusion_steps(findings: list[Finding], suspects: list[int], p2p: Sequence[object]) -> list[NextStep]:
    """The next steps of the findings about the suspects, each once, point-to-point first."""
    steps: list[NextStep] = [P2P_STEP] if p2p else []
    seen_steps: set[tuple[str | None, str | None]] = {(s.tool, s.skill_section) for s in steps}
    kinds = {f.kind for f in findings}
    for f in findings:
        if f.severity == "info" or _consequence(f, kinds) is not None:
            continue
        if f.ranks and suspects and not set(f.ranks) & set(suspects) and f.kind != "collective_timeout":
            continue
        for s in f.next_steps:
            if (s.tool, s.skill_section) not in seen_steps:
                seen_steps.add((s.tool, s.skill_section))
                steps.append(s)
    return steps


@dataclass
class _Blame:
    """Suspects and victims as ``conclude`` builds them, with the evidence for each (the suspects' first)."""

    suspects: list[int] = field(default_factory=list)
    victims: set[int] = field(default_factory=set)
    lead: list[str] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)
    story: list[str] = field(default_factory=list)

    @property
    def evidence(self) -> list[str]:
        return [*self.lead, *self.rest]

    def suspect(self, rank: int, why: str, story: bool = False) -> None:
        if rank not in self.suspects:
            self.suspects.append(rank)
        self.victims.discard(rank)
        self.lead.append(f"rank {rank}: {why}")
        if story:
            self.story.append(f"rank {rank} {why}")

    def victim(self, rank: int, why: str) -> None:
        if rank not in self.suspects:
            self.victims.add(rank)
        self.rest.append(f"rank {rank}: {why}")


def _causes(findings: list[Finding], kinds: set[str], blame: _Blame) -> dict[int, str]:
    """Suspects from each rank's own failure; returns the ranks that failed on their own."""
    primary = _primary_cause_ranks(findings, kinds)
    for f in findings:
        why = _consequence(f, kinds)
        for r in f.ranks if why is not None else ():
            if why is not None and f.facts.get("signal") == "SIGABRT":
                blame.victim(r, why)
            else:  # the launcher's SIGTERM: the failures table says it; no evidence line of its own
                blame.victims.add(r)
    for kind in _CAUSE_KINDS:
        for f in findings:
            if f.kind != kind or not f.ranks or _consequence(f, kinds) is not None:
                continue
            if kind == "nccl_error" and f.severity == "warning":
                continue
            if kind == "nccl_error" and set(f.ranks) <= set(primary) and kinds & {"duplicate_gpu"}:
                continue  # the shared GPU is this rank's failure; its NCCL error only reports it
            if kind == "nccl_error" and primary and not set(f.ranks) & set(primary):
                for r in f.ranks:  # the communicator failed because a peer died first
                    blame.victim(r, f"NCCL error after {primary[min(primary)]} (a consequence)")
                continue
            if kind == "collective_mismatch":
                continue  # decided together below: the rank the others name
            for r in f.ranks:
                blame.suspect(r, f.message)
    return primary


def conclude(
    findings: list[Finding],
    failures: list[FailureRecord],
    seen_ranks: Iterable[int],
    world_size: int | None = None,
) -> Conclusion:
    """Name the suspect ranks and the victims, with the evidence, from all findings together."""
    seen = set(seen_ranks)
    if world_size:
        seen |= set(range(world_size))
    blame = _Blame()
    kinds = {f.kind for f in findings}
    peer = _by_rank(findings, "peer_closed")
    for r in sorted(peer):
        blame.victim(r, "saw its peer's connection close (a victim)")
    primary = _causes(findings, kinds, blame)
    for rank, why in [*_mismatch_suspects(findings), *_barrier_named(findings)]:
        blame.suspect(rank, why)
    for rank, why, is_suspect in _timeout_roles(findings, seen, set(peer), blame_silent=not primary):
        if is_suspect:
            blame.suspect(rank, why, story="fewer collective" in why or "waits at #" in why)
        else:
            blame.victim(rank, why)
    note = _same_work_note(findings)  # said in the summary
    first = next((rec for rec in failures if rec.first_observed), None)
    if first is not None and first.rank is not None:
        line, may_blame = _first_observed(first, blame.victims)
        blame.rest.append(line)
        if may_blame and not blame.suspects:
            blame.suspect(first.rank, f"first observed failure with exitcode {first.exitcode}")
    if not blame.suspects and blame.victims and not note:
        for r in sorted(seen - blame.victims):
            blame.suspect(r, "the only rank that is not a victim")
    victims = sorted(blame.victims - set(blame.suspects))
    p2p = _p2p_timeouts(findings)
    summary = _summary(findings, kinds, blame.suspects, victims, p2p, blame.story or ([note] if note else []))
    steps = _conclusion_steps(findings, blame.suspects, p2p)
    return Conclusion(
        suspect_ranks=blame.suspects,
        victim_ranks=victims,
        summary=summary,
        evidence=blame.evidence,
        next_steps=steps[:6],
    )


_PRIMARY_KINDS = (
    "gpu_xid",
    "duplicate_gpu",
    "device_assert",
    "cuda_oom",
    "cuda_error",
    "thread_died",
    "dataloader_worker_killed",
    "shm_exhausted",
)


def _primary_cause_ranks(findings: list[Finding], kinds: set[str]) -> dict[int, str]:
    """Ranks whose own process failed (a CUDA error, an OOM, a hardware fault, a SIGKILL), with what.

    When one rank's GPU fails, NCCL on every other rank fails next (``ncclRemoteError``, an aborted
    communicator): those NCCL errors are the consequence, not a second cause.
    """
    out: dict[int, str] = {}
    for f in findings:
        killed = f.kind == "killed_by_signal" and f.facts.get("signal") is not None
        if f.kind in _PRIMARY_KINDS or (killed and _consequence(f, kinds) is None):
            for r in f.ranks:
                out.setdefault(r, f"rank {r}'s {f.kind.replace('_', ' ')}")
    return out


def _mismatch_suspects(findings: list[Finding]) -> list[tuple[int, str]]:
    """The ranks at fault in TORCH_DISTRIBUTED_DEBUG=DETAIL mismatches.

    Every rank that checks its fingerprint against the others reports "Rank R is running X, but
    Rank S is running Y": with one odd rank, every other rank names it and it names one of them.
    The rank most reporting ranks name (at least two, more than any other) is the one at fault, and
    so is a rank every report names when it reports nothing itself (a log that kept only some
    ranks' errors); with no such rank (two ranks naming each other) each reporting rank stays a
    suspect.
    """
    reports: dict[int, int] = {}
    for f in findings:
        other = f.facts.get("other_rank") if f.kind == "collective_mismatch" else None
        for r in f.ranks if other is not None else ():
            reports[r] = int(other)  # type: ignore[arg-type]
    if not reports:
        return []
    named: dict[int, list[int]] = {}
    for reporter, other in reports.items():
        named.setdefault(other, []).append(reporter)
    ordered = sorted(named.items(), key=lambda kv: -len(kv[1]))
    top, by = ordered[0]
    runner_up = len(ordered[1][1]) if len(ordered) > 1 else 0
    if (len(by) >= 2 and len(by) > runner_up) or (len(named) == 1 and top not in reports):
        return [
            (top, f"named by ranks {rank_ranges(sorted(by))} as running a different collective than theirs")
        ]
    return [(r, f"called a different collective than rank {o}") for r, o in reports.items()]


_HEADLINE_KINDS = ("duplicate_gpu", "device_assert", "thread_died")
"""Kinds whose own message is the summary's first sentence (they say what happened and where)."""


def _headlines(findings: list[Finding]) -> list[str]:
    """One sentence per headline finding, said once: two ranks that report the same duplicate GPU
    are one sentence naming both, not the same fix twice."""
    out: list[str] = []
    seen: set[tuple[str, frozenset[int]]] = set()
    for f in findings:
        key = (f.kind, frozenset([*f.ranks, *([f.facts["other_rank"]] if "other_rank" in f.facts else [])]))
        if f.kind == "duplicate_gpu" and key in seen:
            continue
        seen.add(key)
        out.append(_one_line(f))
    return out


def _one_line(f: Finding) -> str:
    """A finding of _HEADLINE_KINDS as one sentence, with its rank and call site."""
    on = f" on rank {f.ranks[0]}" if f.ranks else ""
    site = f" (at {f.facts['call_site']})" if f.facts.get("call_site") else ""
    if f.kind == "duplicate_gpu":
        return (
            f"Two ranks share one GPU: {f.message}. Fix: one GPU per rank "
            "(torch.cuda.set_device(LOCAL_RANK) or the launcher's device mapping)."
        )
    return f"{f.message[0].upper()}{f.message[1:]}{on}{site}."


P2P_OPS = frozenset({"SEND", "RECV"})
"""NCCL work types (``OpType=RECV``) of point-to-point ops. Gloo's "Timed out waiting ... for recv
operation" is not one: every gloo collective sends and receives through that transport."""

P2P_STEP = NextStep(
    action="Order the sends and recvs so one side of each pair sends while the other receives (rank parity, "
    "isend before recv, or batch_isend_irecv); while a job still hangs, dump_stacks names the cycle of waits.",
    tool=None,
    skill_section="skill/hangs.md#point-to-point-deadlock",
)


def _p2p_timeouts(findings: list[Finding]) -> list[str]:
    """``["RECV on ranks 0, 1"]`` when every timed-out op with a known name is a send or a recv."""
    by_op: dict[str, set[int]] = {}
    for f in findings:
        if f.kind == "collective_timeout" and f.facts.get("op"):
            by_op.setdefault(str(f.facts["op"]), set()).update(f.ranks)
    if not by_op or not all(op in P2P_OPS for op in by_op):
        return []
    return [
        f"{op} on {ranks_phrase(sorted(ranks)) if ranks else 'some ranks'}"
        for op, ranks in sorted(by_op.items())
    ]


def _summary(
    findings: list[Finding],
    kinds: set[str],
    suspects: list[int],
    victims: list[int],
    p2p: list[str],
    story: list[str],
) -> str:
    """``p2p``: the timed-out send/recv work (:func:`_p2p_timeouts`), empty when not all of it is;
    ``story``: what the watchdog's counts say about the suspects (or that they name none)."""
    if not findings:
        return "No known failure pattern found in the logs."
    parts: list[str] = _headlines([f for f in findings if f.kind in _HEADLINE_KINDS])
    if "unused_parameters" in kinds:
        parts.append(
            "DDP found parameters that received no gradient: a model/loss bug present on every rank, "
            "fixed with find_unused_parameters=True or by using every parameter."
        )
    if "address_in_use" in kinds:
        parts.append(
            "The master port was already taken, so the job never started: pick another --master_port."
        )
    if "rendezvous_failure" in kinds:
        parts.append(
            "Rendezvous failed: not all nodes joined in time (check that every node started with the same "
            "nnodes/rdzv_id/endpoint and can reach it)."
        )
    if "collective_mismatch" in kinds:
        parts.append("Ranks issued different collectives (or shapes) at the same step.")
    if "cuda_oom" in kinds:
        parts.append("A rank ran out of GPU memory.")
    sig = {str(f.facts.get("signal")) for f in findings if f.kind == "killed_by_signal"}
    if "SIGKILL" in sig:
        parts.append(
            "A rank was killed with SIGKILL (exit -9/137): most likely the host's OOM killer; check dmesg."
        )
    if "dataloader_worker_killed" in kinds:
        parts.append("A DataLoader worker died, taking its rank down.")
    if "shm_exhausted" in kinds:
        parts.append("Shared memory (/dev/shm) ran out.")
    if "gpu_xid" in kinds:
        parts.append("The kernel log shows GPU Xid errors: check the hardware before anything else.")
    if "launcher_stopped" in kinds and not suspects:
        parts.append(
            "torchrun was stopped from outside (a scheduler or a user) while its workers ran: no rank failed on "
            "its own in the log; a job stopped after it made no progress was hung."
        )
    if p2p:
        parts.append(
            f"Point-to-point ops timed out ({', '.join(p2p)}): a recv waits for its peer's send and a send for "
            "its peer's recv. If every timed-out rank was receiving (or every one sending), no rank was on the "
            "other side: a send/recv ordering deadlock in the program."
        )
    elif "collective_timeout" in kinds and story:
        parts.append("Collectives timed out: " + "; ".join(story) + ".")
    elif "collective_timeout" in kinds:
        parts.append(
            "Collectives timed out: the ranks that waited are victims of the rank that did not arrive."
        )
    if suspects:
        parts.append(f"Suspect rank(s): {', '.join(map(str, suspects))}.")
    if victims:
        parts.append(f"Victims (failed because of another rank): {', '.join(map(str, victims))}.")
    if not parts:
        top = findings[0]
        parts.append(f"Most significant event: {top.message}.")
    return " ".join(parts)
