"""Log triage, pure: lines in, findings and a root-cause verdict out.

``LogScanner`` consumes lines one at a time (with their source, line number and
a rank hint from the file name) and keeps only bounded state: one accumulating
finding per (kind, rank, source), torchrun's failure table, and a pid→rank map
from NCCL's init lines. ``conclude`` reasons across the findings: ranks that
report a closed peer or wait in a timed-out collective are victims; the rank
that lags, stays silent, runs out of memory or is killed is the suspect.
torchrun's "first observed failure" is only evidence: the first rank to fail is
often a victim that timed out first.

The scanner only routes each line; its readers sit in their own modules:
``torchrun_lines`` (the launcher's table and exits), ``tracebacks`` (call sites,
dead threads), ``rule_facts`` (what a rule's line says), ``accumulator`` (one
finding per kind, rank and source) and ``after_scan`` (what needs the whole log).

No I/O here: the shell (``rankscope.capabilities.triage``) reads files and passes lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from rankscope.analysis.ranges import rank_ranges, ranks_phrase
from rankscope.analysis.triage import rule_facts
from rankscope.analysis.triage.accumulator import EXCERPT_CHARS, Accumulator
from rankscope.analysis.triage.after_scan import (
    WATCHDOG_EVIDENCE,
    derive_from_records,
    explain_exit_aborts,
    fold_duplicate_gpu,
    mark_watchdog_aborts,
)
from rankscope.analysis.triage.log_rules import ALL_NEEDLES, RULES, Rule
from rankscope.analysis.triage.torchrun_lines import TorchrunLines
from rankscope.analysis.triage.tracebacks import COLLECTIVE_STACK, ThreadEnd, Tracebacks
from rankscope.analysis.units import size_or_none
from rankscope.models.core import Finding, NextStep
from rankscope.models.logs import FailureRecord

_RANK_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:")

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
    COLLECTIVE_STACK,
    ".py:",  # a frame of that stack: "#2 main from /workspace/train.py:35"
)
NEEDLES: tuple[str, ...] = tuple(dict.fromkeys(ALL_NEEDLES + TABLE_NEEDLES))
"""Every literal that can make a line interesting; lines without any are skipped."""
TABLE_END = "====="
SHELL_NEEDLES: tuple[str, ...] = (*NEEDLES, TABLE_END)
"""What a shell pre-filtering lines must pass to ``feed``: the needles and the end of torchrun's table."""


parse_size = size_or_none  # sizes as PyTorch prints them ("2.00 GiB"); None when not a size


class LogScanner:
    """Streaming rule engine: ``feed`` lines, then ``findings()`` and ``failures()``.

    It routes each line to the reader it belongs to (torchrun's lines, a traceback, or the rules),
    decides the rank a line is about, and accumulates what the rules make of it."""

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        self._redact = redact or (lambda s: s)
        self.seen_ranks: set[int] = set()
        self._accs = Accumulator(self._redact)
        self._torchrun = TorchrunLines(self._redact, self.seen_ranks)
        self._tracebacks = Tracebacks()
        self.stack_sources: set[str] = self._tracebacks.stack_sources
        """Sources that hold faulthandler stacks ("most recent call first"): saved stacks as well as logs."""
        self.collective_sites: dict[int, str] = {}
        """Per rank, the user frame of the collective NCCL's watchdog timed out in (its "Stack trace of
        the failed collective"), kept beside the findings: the silent rank's reading needs it."""

    @property
    def world_size(self) -> int | None:
        """The largest communicator NCCL's init lines reported; None when they were not logged."""
        return self._torchrun.world_size

    @world_size.setter
    def world_size(self, value: int | None) -> None:
        self._torchrun.world_size = value

    # -- input -----------------------------------------------------------------------------------------
    def feed(self, line: str, line_no: int, source: str, rank_hint: int | None = None) -> None:
        """Consume one line (without its newline). Lines without any needle cost one scan."""
        if self._torchrun.in_table and TABLE_END in line and line.strip().startswith(TABLE_END):
            self._torchrun.close_table()
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
        if self._torchrun.table_line(text, line_no, source):
            return
        if self._torchrun.launcher_line(text, line_no, source):
            return
        frame = self._tracebacks.collective_frame(text, line_no, source, rank)
        if isinstance(frame, tuple) and frame[0] is not None:
            self.collective_sites.setdefault(frame[0], frame[1])
        if frame is not False:
            return
        if self._tracebacks.read(text, line_no, source, rank):
            return
        end = self._tracebacks.thread_end(text, line_no, source, rank)
        if end is not None:
            self._thread_ended(end, text, line_no, source, rank)
        if rank is None:
            rank = self._torchrun.rank_of_nccl_line(text)
        for rule in RULES:
            if any(n in text for n in rule.needles):
                self._apply(rule, text, line_no, source, rank)

    def _thread_ended(self, end: ThreadEnd, text: str, line_no: int, source: str, rank: int | None) -> None:
        """Complete a dead thread's finding with the exception that closed its traceback."""
        acc = self._accs.by_key.get(("thread_died", rank, source))
        if acc is None:
            return
        acc.facts.setdefault("exception", end.exception)
        if end.message:
            acc.facts.setdefault("exception_message", self._redact(end.message.strip())[:300])
        if end.call_site:
            acc.facts.setdefault("call_site", end.call_site)
        acc.message = f"thread {end.thread} died: {self._redact(text.strip())[:200]}"
        acc.lines.append(line_no)
        acc.excerpt.append(self._redact(text.strip())[:EXCERPT_CHARS])

    def call_site(self, source: str, rank: int | None, line_no: int) -> str | None:
        """The innermost user frame of the traceback just printed on this rank, if recent enough."""
        return self._tracebacks.call_site(source, rank, line_no)

    def add_failure(self, record: FailureRecord, source: str, line_no: int = 0) -> None:
        """A failure record read from a torchelastic error.json by the shell."""
        self._torchrun.records.append((record, source, line_no))
        if record.rank is not None:
            self.seen_ranks.add(record.rank)

    def _apply(self, rule: Rule, text: str, line_no: int, source: str, rank: int | None) -> None:
        """Accumulate what ``rule`` makes of a line; the rank the line names wins over the file's."""
        facts = rule_facts.line_facts(rule, text)
        if facts is None:
            return
        if rank is None and isinstance(facts.get("rank"), int):
            rank = facts["rank"]
        if rank is not None:
            self.seen_ranks.add(rank)
        if isinstance(facts.get("other_rank"), int):
            self.seen_ranks.add(facts["other_rank"])
        facts.pop("rank", None)
        if rule_facts.takes_call_site(rule, text):
            site = self.call_site(source, rank, line_no)
            if site:
                facts.setdefault("call_site", site)
        draft = rule_facts.shaped(rule, text, facts, rank)
        if rule.kind == "thread_died":
            self._tracebacks.watch_thread(source, rank, str(facts.get("thread", "?")))
        self._accs.add(draft, rank, source, line_no, text)

    # -- output ----------------------------------------------------------------------------------------------
    def failures(self) -> list[FailureRecord]:
        """The launcher's failure records (torchrun's "failed" lines when its table is missing)."""
        return [r for r, _, _ in self._torchrun.failure_records()]

    def findings(self) -> list[Finding]:
        """Every accumulated finding, plus those derived from failure records; most important first."""
        derive_from_records(self._accs, self._torchrun.failure_records(), self._torchrun.sigterm_pids)
        fold_duplicate_gpu(self._accs)
        mark_watchdog_aborts(self._accs)
        explain_exit_aborts(self._accs)
        return self._accs.findings()


# -- reasoning across findings --------------------------------------------------------------------------------

_CAUSE_KINDS = (
    "gpu_xid",
    "duplicate_gpu",
    "device_assert",
    "cuda_oom",
    "cuda_error",
    "thread_died",
    "killed_by_signal",
    "exit_without_destroy",
    "dataloader_worker_killed",
    "shm_exhausted",
    "nccl_error",
    "collective_mismatch",
    "unused_parameters",
)


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
    failing = _int(seq)
    for r, f in _by_rank(findings, "fr_dump_signal").items():
        behind = _int(f.facts.get("last_enqueued"))
        if r not in timeouts and failing is not None and behind is not None and behind < failing:
            return None  # a rank that never timed out says it never issued that work: it fell behind
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
    if sig == "SIGABRT" and kinds & WATCHDOG_EVIDENCE:
        return "aborted (SIGABRT) by NCCL's watchdog after a timeout or an error: a consequence, not a cause"
    if sig == "SIGABRT" and "exit_without_destroy" in kinds:
        return "its SIGABRT (exit -6) is that abort at exit"
    return None


def _first_observed(first: FailureRecord, victims: set[int]) -> tuple[str, bool]:
    """What torchrun's "first observed failure" says (the first rank to exit), and whether it may be blamed."""
    how = f"exitcode {first.exitcode}" + (f", {first.signal}" if first.signal else "")
    line = f"torchrun named rank {first.rank} as the first observed failure ({how}): the first to exit"
    if first.rank in victims:
        return line + "; a victim that gave up waiting", False
    return line + ", not necessarily the cause", True


def unique_steps(*lists: Iterable[NextStep]) -> list[NextStep]:
    """The steps of ``lists`` in order, each (tool, playbook section) once: two findings that ask
    for the same call and the same reading ask once."""
    out: list[NextStep] = []
    seen: set[tuple[str | None, str | None]] = set()
    for steps in lists:
        for s in steps:
            if (s.tool, s.skill_section) not in seen:
                seen.add((s.tool, s.skill_section))
                out.append(s)
    return out


def _conclusion_steps(findings: list[Finding], suspects: list[int], p2p: Sequence[object]) -> list[NextStep]:
    """The next steps of the findings about the suspects, each once, point-to-point first."""
    kinds = {f.kind for f in findings}
    about = [
        f.next_steps
        for f in findings
        if f.severity != "info"
        and _consequence(f, kinds) is None
        and not (f.ranks and suspects and not set(f.ranks) & set(suspects) and f.kind != "collective_timeout")
    ]
    return unique_steps([P2P_STEP] if p2p else [], *about)


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
            if kind in ("nccl_error", "exit_without_destroy") and f.severity in ("warning", "info"):
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


CHECKER_OPS = frozenset({"GATHER", "REDUCE"})
"""DETAIL's own checking collective: a fingerprint ``SequenceNumber=0, OpType=GATHER`` (or REDUCE) on
the far side of a mismatch is ProcessGroupWrapper's check, not the other rank's collective."""


def _fingerprint(f: Finding, side: str = "") -> tuple[object, ...]:
    """(sequence number, op, shape) of one side of a DETAIL mismatch: the reporting rank's own, or
    ``side="other_"``: the one it was compared with."""
    return tuple(f.facts.get(f"{side}{key}") for key in ("seq", "op", "shape"))


def _is_checker(f: Finding) -> bool:
    """The far side of this mismatch is DETAIL's checker (sequence number 0, GATHER/REDUCE)."""
    return str(f.facts.get("other_seq")) == "0" and f.facts.get("other_op") in CHECKER_OPS


def _odd_own(own: dict[int, tuple[object, ...]]) -> list[tuple[int, str]]:
    """The ranks whose own collective differs from the one most reporting ranks run (a strict majority)."""
    counts: dict[tuple[object, ...], list[int]] = {}
    for rank, fp in own.items():
        counts.setdefault(fp, []).append(rank)
    (top, majority), *_ = sorted(counts.items(), key=lambda kv: -len(kv[1]))
    if len(counts) < 2 or len(majority) < 2 or len(majority) * 2 <= len(own):
        return []

    def said(fp: tuple[object, ...], versus: tuple[object, ...]) -> str:
        shape = f" of shape {fp[2]}" if fp[2] and fp[2] != versus[2] and fp[1] == versus[1] else ""
        return f"{fp[1]}{shape} at sequence number {fp[0]}"

    others = rank_ranges(sorted(majority))
    return [
        (r, f"its own collective ({said(fp, top)}) differs from the one ranks {others} run ({said(top, fp)})")
        for r, fp in sorted(own.items())
        if fp != top
    ]


def _mismatch_suspects(findings: list[Finding]) -> list[tuple[int, str]]:
    """The ranks at fault in TORCH_DISTRIBUTED_DEBUG=DETAIL mismatches.

    Every rank that checks its fingerprint against the others reports "Rank R is running X, but
    Rank S is running Y". Each rank's own X decides first: the rank whose own collective (op,
    sequence number, shape) differs from a strict majority's is at fault. The far side Y may be
    DETAIL's own checker (``SequenceNumber=0`` GATHER/REDUCE), which says nothing of rank S's
    collective. Else, with one odd rank, every other rank names it and it names one of them: the
    rank most reporting ranks name (at least two, more than any other) is the one at fault, and so
    is a rank every report names when it reports nothing itself (a log that kept only some ranks'
    errors; not when the report names the checker); with no such rank (two ranks naming each
    other) each reporting rank stays a suspect.
    """
    reports: dict[int, int] = {}
    own: dict[int, tuple[object, ...]] = {}
    checker = True
    for f in findings:
        other = f.facts.get("other_rank") if f.kind == "collective_mismatch" else None
        for r in f.ranks if other is not None else ():
            reports[r] = int(other)  # type: ignore[arg-type]
            own[r] = _fingerprint(f)
            checker = checker and _is_checker(f)
    if not reports:
        return []
    odd = _odd_own(own) if len(own) >= 3 else []
    if odd:
        return odd
    named: dict[int, list[int]] = {}
    for reporter, other in reports.items():
        named.setdefault(other, []).append(reporter)
    ordered = sorted(named.items(), key=lambda kv: -len(kv[1]))
    top, by = ordered[0]
    runner_up = len(ordered[1][1]) if len(ordered) > 1 else 0
    if (len(by) >= 2 and len(by) > runner_up) or (len(named) == 1 and top not in reports and not checker):
        return [
            (top, f"named by ranks {rank_ranges(sorted(by))} as running a different collective than theirs")
        ]
    return [(r, f"called a different collective than rank {o}") for r, o in reports.items()]


TIMEOUT_SENTENCE = "Collectives timed out: the ranks that waited are victims of the rank that did not arrive."
"""The summary's sentence for timeouts that name no laggard; a reading of the silent rank's code replaces it."""

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
        out.append(one_line(f))
    return out


def one_line(f: Finding) -> str:
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


def _exit_headline(findings: list[Finding]) -> list[str]:
    """What an exit without destroy_process_group() adds to the summary: the crash when it is one, a
    warning when the run ended well, nothing when it only follows another failure."""
    severities = {f.severity for f in findings if f.kind == "exit_without_destroy"}
    if severities & {"error", "critical"}:
        return [
            "A rank aborted at exit (terminate called without an active exception): the script never called "
            "destroy_process_group(); add it at the end of main()."
        ]
    if "warning" in severities:
        return [
            "The script exits without destroy_process_group() (torch warns): add it at the end of main()."
        ]
    return []


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
    parts.extend(_exit_headline(findings))
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
        parts.append(TIMEOUT_SENTENCE)
    if suspects:
        parts.append(f"Suspect rank(s): {', '.join(map(str, suspects))}.")
    if victims:
        parts.append(f"Victims (failed because of another rank): {', '.join(map(str, victims))}.")
    if not parts:
        top = findings[0]
        parts.append(f"Most significant event: {top.message}.")
    return " ".join(parts)
