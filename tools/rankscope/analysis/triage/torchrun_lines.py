"""torchrun's own lines: its failure table, its per-worker exits, and NCCL's rank/pid map.

The launcher, not the ranks, says which worker exited how: the "Root Cause (first observed
failure)" / "Failures:" table, the "failed (exitcode: ...)" lines (all that is left when a log is
cut before the table), the SIGTERM it sends the survivors, mp.spawn's exits. NCCL's comm-init lines
tie a host:pid to a rank and give the world size, so a later NCCL line without a rank prefix still
lands on its rank. These lines become failure records, not findings: the findings are derived from
the records once everything is read (``after_scan``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from rankscope.analysis.triage.accumulator import EXCERPT_CHARS
from rankscope.models.logs import FailureRecord

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
SIGNAME = {v: k for k, v in _SIGNUM.items()}
"""Signal names by number: torchrun prints a signal death as a negative exit code, a shell as 128+N."""

Placed = tuple[FailureRecord, str, int]
"""A failure record with the source and line number it was read from."""


@dataclass
class _Table:
    """torchrun's ChildFailedError table while it is being read."""

    source: str
    first_observed: bool = False
    current: dict[str, str] = field(default_factory=dict)
    line: int = 0


class TorchrunLines:
    """Reads the launcher's lines into failure records; ranks it learns join ``seen_ranks``."""

    def __init__(self, redact: Callable[[str], str], seen_ranks: set[int]) -> None:
        self._redact = redact
        self._seen_ranks = seen_ranks
        self._table: _Table | None = None
        self.records: list[Placed] = []
        """From the table, mp.spawn's exits and error.json files (``LogScanner.add_failure``)."""
        self._failed_lines: list[Placed] = []
        self.sigterm_pids: set[int] = set()
        """The pids torchrun sent SIGTERM: their SIGTERM deaths are the launcher's doing."""
        self._pid_rank: dict[tuple[str, int], tuple[int, int]] = {}
        self.world_size: int | None = None

    @property
    def in_table(self) -> bool:
        """Whether a failure table is being read (its closing ``=====`` line ends it)."""
        return self._table is not None

    def table_line(self, text: str, line_no: int, source: str) -> bool:
        """Read one line of the failure table; True when it was one (a header or a field)."""
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
        """The table entry read so far becomes a record (an entry ends at its traceback or the next one)."""
        table = self._table
        if table is None or not table.current:
            return
        cur, table.current = table.current, {}
        rec = FailureRecord(
            first_observed=table.first_observed,
            time=cur.get("time"),
            host=cur.get("host"),
            error_file=cur.get("error_file"),
            message=self._redact(cur.get("traceback", ""))[:EXCERPT_CHARS],
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
            rec.signal = em["signal"] or (SIGNAME.get(-rec.exitcode) if rec.exitcode < 0 else None)
        self.records.append((rec, table.source, table.line))
        if rec.rank is not None:
            self._seen_ranks.add(rec.rank)

    def close_table(self) -> None:
        """End the table being read, keeping its last entry."""
        self._flush_entry()
        self._table = None

    def launcher_line(self, text: str, line_no: int, source: str) -> bool:
        """Read a worker's exit, torchrun's SIGTERM to a survivor, or NCCL's comm init; True when it was one."""
        m = _TORCHRUN_FAILED.search(text)
        if m:
            code = int(m["exitcode"])
            rec = FailureRecord(
                rank=None,
                local_rank=int(m["local_rank"]),
                pid=int(m["pid"]),
                exitcode=code,
                signal=SIGNAME.get(-code) if code < 0 else None,
                message=self._redact(text.strip())[:300],
            )
            self._failed_lines.append((rec, source, line_no))
            return True
        m = _CLOSING.search(text)
        if m:
            self.sigterm_pids.add(int(m["pid"]))
            return True
        m = _SPAWN_EXIT.search(text)
        if m:
            rec = FailureRecord(
                rank=int(m["rank"]), exitcode=int(m["exitcode"]), message=self._redact(text.strip())[:300]
            )
            self.records.append((rec, source, line_no))
            self._seen_ranks.add(rec.rank or 0)
            return True
        m = _NCCL_COMM.search(text)
        if m:
            self._comm_init(m["host"], int(m["pid"]), int(m["rank"]), int(m["nranks"]))
            return True
        return False

    def _comm_init(self, host: str, pid: int, rank: int, nranks: int) -> None:
        """Map host:pid to its rank in its largest communicator (the world one, not a subgroup's)."""
        old = self._pid_rank.get((host, pid))
        if old is None or nranks > old[1]:
            self._pid_rank[(host, pid)] = (rank, nranks)
        self.world_size = max(self.world_size or 0, nranks)

    def rank_of_nccl_line(self, text: str) -> int | None:
        """The rank of the process an NCCL line (``host:pid:tid [dev] NCCL ...``) came from, once known."""
        nm = _NCCL_LINE.search(text)
        known = self._pid_rank.get((nm["host"], int(nm["pid"]))) if nm else None
        return known[0] if known else None

    def failure_records(self) -> list[Placed]:
        """Every record; with none that names a rank and its exit code (a log cut before the table),
        torchrun's "failed (exitcode ...)" lines stand in, the local rank taken as the rank (one node)."""
        self.close_table()
        records = list(self.records)
        if not any(r.exitcode is not None and r.rank is not None for r, _, _ in records):
            records += [(r.model_copy(update={"rank": r.local_rank}), s, n) for r, s, n in self._failed_lines]
        return records
