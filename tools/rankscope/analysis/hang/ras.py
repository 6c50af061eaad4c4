"""NCCL RAS answers, parsed, and what their launch counts say about a hang.

Formats are NCCL's (``src/ras/client_support.cc``): ``SET FORMAT json`` (NCCL >= 2.28.7)
gives ``communicators[].ranks[].collective_counts`` and ``missing_ranks[].status``; older
servers answer in text, whose MISMATCH warnings read "26 ranks have launched up to operation
6650", "Rank 7 has launched up to operation 60 -- GPU 3 managed by process 1650386 on node
node1", and whose DEAD / INCOMPLETE errors read "Process 3487984 on node 172.16.64.213
managing GPU 5".

A count is taken when a rank *enqueues* a collective: a rank behind the others never called
the collective they wait in (or called one less). If every rank launched the same counts,
the collective was enqueued everywhere and the hang is below Python (NCCL, the network, a
GPU): RAS then shows a healthy job (NVIDIA/nccl#1730), and the verdict says so.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping

from rankscope.analysis.ranges import ranks_phrase
from rankscope.errors import InvalidInput
from rankscope.models.core import Confidence
from rankscope.models.ras import RasComm, RasFinding, RasMissing, RasRank, RasStatus

_STATUS_FLAGS = ("init_state", "async_error")
_BOOL_FLAGS = ("finalize_called", "destroy_flag", "abort_flag")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rank(entry: Mapping[str, object]) -> RasRank | None:
    comm_rank = _int(entry.get("rank"))
    if comm_rank is None:
        return None
    raw = entry.get("collective_counts")
    counts = {str(k): v for k, v in raw.items() if isinstance(v, int) and v} if isinstance(raw, dict) else {}
    raw_status = entry.get("status")
    status: dict[str, object] = raw_status if isinstance(raw_status, dict) else {}
    errors = [f"{k}={status[k]}" for k in _STATUS_FLAGS if _int(status.get(k))]
    errors += [k for k in _BOOL_FLAGS if status.get(k) is True]
    pid = _int(entry.get("pid"))
    return RasRank(
        comm_rank=comm_rank,
        host=str(entry.get("host") or ""),
        pid=pid if pid is not None and pid > 0 else None,
        launched=sum(counts.values()),
        by_op=counts,
        error=", ".join(errors) or None,
    )


def _missing(entry: Mapping[str, object]) -> RasMissing | None:
    comm_rank = _int(entry.get("rank"))
    if comm_rank is None:
        return None
    raw_status = entry.get("status")
    status: dict[str, object] = raw_status if isinstance(raw_status, dict) else {}
    pid = _int(entry.get("pid"))
    return RasMissing(
        comm_rank=comm_rank,
        host=str(entry.get("host") or ""),
        pid=pid if pid is not None and pid > 0 else None,
        dead=status.get("considered_dead") is True,
    )


def parse_json(text: str) -> RasStatus:
    """A ``STATUS`` answer in NCCL's JSON format."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(
            f"NCCL RAS answer is not JSON: {exc}", "Query it by hand: `ncclras -f json`."
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("communicators"), list):
        raise InvalidInput(
            "NCCL RAS JSON answer has no communicators list", "Query it by hand: `ncclras -f json`."
        )
    comms: list[RasComm] = []
    for c in data["communicators"]:
        if not isinstance(c, dict):
            continue
        ranks = [r for e in c.get("ranks") or [] if isinstance(e, dict) and (r := _rank(e)) is not None]
        lost = [
            m for e in c.get("missing_ranks") or [] if isinstance(e, dict) and (m := _missing(e)) is not None
        ]
        comms.append(
            RasComm(
                hash=str(c.get("hash") or "?"),
                size=_int(c.get("size")) or len(ranks),
                ranks=ranks,
                missing=lost,
            )
        )
    raw_ras = data.get("ras")
    ras: dict[str, object] = raw_ras if isinstance(raw_ras, dict) else {}
    return RasStatus(
        format="json",
        nccl_version=str(data["nccl_version"]) if data.get("nccl_version") else None,
        communicators=comms,
        incomplete=bool(_int(ras.get("timeouts_count"))),
    )


_COMM = re.compile(r"^#\d+-\d+ \((?P<hash>[0-9a-fA-Fx]+)\)")
_GROUP = re.compile(
    r"^\s*(?P<n>\d+) ranks have (?:launched up to operation (?P<op>\d+)|not launched any operations)"
)
_ONE = re.compile(
    r"^\s*Rank (?P<rank>\d+) has (?:launched up to operation (?P<op>\d+)|not launched any operations)"
    r"(?: -- GPU \S+ managed by process (?P<pid>\d+) on node (?P<host>\S+))?"
)
_MEMBER = re.compile(
    r"^\s*Rank (?P<rank>\d+) -- GPU \S+ managed by process (?P<pid>\d+) on node (?P<host>\S+)"
)
_LOST = re.compile(r"^\s*Process (?P<pid>\d+) on node (?P<host>\S+)")
_VERSION = re.compile(r"NCCL version (\S+)")


def parse_text(text: str) -> RasStatus:
    """A ``STATUS`` answer in NCCL's text format: the ranks its warnings name, with their counts,
    and the processes its DEAD / INCOMPLETE errors name."""
    comms: list[RasComm] = []
    lost: list[RasMissing] = []
    section = ""
    count: int | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in ("DEAD", "INCOMPLETE", "Errors", "Warnings"):
            section = stripped
        m = _COMM.match(stripped)
        if m:
            comms.append(RasComm(hash=m.group("hash"), size=0))
            count = None
            continue
        if (g := _GROUP.match(line)) and comms:
            count = int(g.group("op") or 0)
            comms[-1].counts[count] = int(g.group("n"))
        elif (one := _ONE.match(line)) and comms:
            launched = int(one.group("op") or 0)
            comms[-1].counts[launched] = comms[-1].counts.get(launched, 0) + 1
            comms[-1].ranks.append(_text_rank(one, launched))
        elif (member := _MEMBER.match(line)) and comms and count is not None:
            comms[-1].ranks.append(_text_rank(member, count))
        elif (gone := _LOST.match(line)) and section in ("DEAD", "INCOMPLETE"):
            lost.append(
                RasMissing(
                    comm_rank=-1, host=gone.group("host"), pid=int(gone.group("pid")), dead=section == "DEAD"
                )
            )
    if lost:
        comms.append(RasComm(hash="(job)", size=0, missing=lost))
    version = _VERSION.search(text)
    return RasStatus(format="text", nccl_version=version.group(1) if version else None, communicators=comms)


def _text_rank(m: re.Match[str], launched: int) -> RasRank:
    return RasRank(
        comm_rank=int(m.group("rank")),
        host=m.group("host") or "",
        pid=int(m.group("pid")) if m.group("pid") else None,
        launched=launched,
    )


def _global(
    comm: RasComm, comm_rank: int, pid: int | None, pid_rank: Mapping[int, int], world: int | None
) -> int | None:
    """The global rank of a communicator rank: by its pid on this host, else by position when the
    communicator spans the whole world (the default group's)."""
    if pid is not None and pid in pid_rank:
        return pid_rank[pid]
    if world is not None and comm.size == world and comm_rank >= 0:
        return comm_rank
    return None


def _who(comm: RasComm, rank: RasRank | RasMissing, pid_rank: Mapping[int, int], world: int | None) -> str:
    g = _global(comm, rank.comm_rank, rank.pid, pid_rank, world)
    where = f"pid {rank.pid}" + (f" on {rank.host}" if rank.host else "") if rank.pid else rank.host
    name = f"rank {g}" if g is not None else f"communicator rank {rank.comm_rank}"
    return f"{name} ({where})" if where else name


def _mix(rank: RasRank) -> tuple[tuple[str, int], ...]:
    """What a rank launched, per collective type: an extra barrier in place of an all_reduce
    leaves the total equal and the mix different."""
    return tuple(sorted(rank.by_op.items())) if rank.by_op else (("", rank.launched),)


def _ops(mix: tuple[tuple[str, int], ...]) -> str:
    named = [f"{op} {n}" for op, n in mix if op]
    return f" ({', '.join(named)})" if named else ""


def _split(comm: RasComm) -> tuple[str, list[RasRank]] | None:
    """What most ranks launched and the ranks that launched something else; None when they agree
    or no majority stands out."""
    if comm.counts:  # text: only the tally of totals
        tally = Counter(comm.counts)
        (top, n), (_, second) = tally.most_common(2) if len(tally) > 1 else ((0, 0), (0, 0))
        if len(tally) < 2 or n == second:
            return None
        off = [r for r in comm.ranks if r.launched != top]
        return (f"{top} collectives", off) if off else None
    mixes = Counter(_mix(r) for r in comm.ranks)
    if len(mixes) < 2:
        return None
    (common, n), (_, second) = mixes.most_common(2)
    if n == second:
        return None
    off = [r for r in comm.ranks if _mix(r) != common]
    return (f"{sum(v for _, v in common)} collectives{_ops(common)}", off)


def _launches(first: RasStatus, second: RasStatus | None) -> bool | None:
    if second is None:
        return None
    before = {(c.hash, r.comm_rank): r.launched for c in first.communicators for r in c.ranks}
    after = {(c.hash, r.comm_rank): r.launched for c in second.communicators for r in c.ranks}
    shared = before.keys() & after.keys()
    return any(before[k] != after[k] for k in shared) if shared else None


def _agreeing(last: RasStatus, moved: bool | None) -> RasFinding:
    """No rank off its communicator's count and none lost: every rank enqueued the collective."""
    n = len(last.communicators)
    said = (
        f"every rank of {n} communicator(s) launched the same collectives"
        if n
        else "no rank is off its communicator's launch count and none is lost"
    )
    return RasFinding(
        kind="agree",
        summary=f"NCCL RAS: {said}"
        + (" and the counts did not move" if moved is False else "")
        + ": each rank enqueued the collective, so what is stuck is below Python (NCCL, the network, a GPU)",
        evidence=[
            f"NCCL RAS {last.format} answer" + (f" (NCCL {last.nccl_version})" if last.nccl_version else "")
        ],
        progressing=moved,
    )


def finding(
    first: RasStatus,
    second: RasStatus | None = None,
    *,
    pid_rank: Mapping[int, int] | None = None,
    world_size: int | None = None,
    interval_s: float = 0.0,
) -> RasFinding:
    """What the launch counts (and the ranks RAS lost) say, read once or twice ``interval_s`` apart."""
    pids = pid_rank or {}
    last = second or first
    moved = _launches(first, second)
    suspects: set[int] = set()
    evidence: list[str] = []
    lost = [(c, m) for c in last.communicators for m in c.missing]
    for comm, m in lost:
        g = _global(comm, m.comm_rank, m.pid, pids, world_size)
        if g is not None:
            suspects.add(g)
        evidence.append(
            f"NCCL RAS: {_who(comm, m, pids, world_size)} {'is dead' if m.dead else 'does not answer'}"
        )
    for comm in last.communicators:
        split = _split(comm)
        if split is None:
            continue
        top, off = split
        for r in off:
            g = _global(comm, r.comm_rank, r.pid, pids, world_size)
            if g is not None:
                suspects.add(g)
        behind = ", ".join(
            f"{_who(comm, r, pids, world_size)} launched {r.launched}{_ops(_mix(r))}" for r in off[:8]
        )
        evidence.append(f"NCCL RAS communicator {comm.hash[:10]}: most ranks launched {top}; {behind}")
    if not evidence:
        return _agreeing(last, moved)
    confidence: Confidence = "high" if moved is False or any(m.dead for _, m in lost) else "medium"
    if moved:
        confidence = "low"
    ranks = sorted(suspects)
    off_count = any(_split(c) for c in last.communicators)
    if off_count:
        verb = "is" if len(ranks) == 1 else "are"
        head = (
            f"NCCL RAS: {ranks_phrase(ranks)} {verb} off the others' launch count"
            if ranks
            else "NCCL RAS: launch counts differ"
        )
    else:
        who = ranks_phrase(ranks) if ranks else "some ranks"
        head = f"NCCL RAS cannot reach {who}: the process is gone or frozen"
    tail = {
        None: " (one read)",
        False: f" and no rank launched anything in {interval_s:.0f} s: the job is stuck there",
        True: f"; the counts still move ({interval_s:.0f} s apart): a straggler, not a hang",
    }[moved]
    if last.incomplete:
        evidence.append("NCCL RAS timed out on some peers: its data is partial")
    return RasFinding(
        kind="off_count" if off_count else "lost",
        suspect_ranks=ranks,
        confidence=confidence,
        summary=head + tail,
        evidence=evidence[:12],
        progressing=moved,
    )


__all__ = ["finding", "parse_json", "parse_text"]
