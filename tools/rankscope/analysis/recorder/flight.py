"""Pure analysis of flight-recorder dumps: align ranks by sequence id, find the first disagreement.

Every rank's recorder numbers the collectives of each process group
(``collective_seq_id``; p2p ops count ``p2p_seq_id`` instead). Ranks that run
the same program record the same op with the same sizes under the same number,
so the first number at which they differ is where the job went wrong: a rank
that never recorded it skipped it (or is stuck before it), a different op
means a different call order, different sizes mean a shape mismatch.

Input is the already-parsed dicts (the shell reads the files); nothing here
touches files, processes or the clock. The optional ``matcher`` lets the shell
plug in torchfrtrace's own ``Op.match`` without this module importing torch.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rankscope.analysis.code_origin import origin_of
from rankscope.analysis.p2p import Waits, cycle_phrase, find_cycle, verb
from rankscope.analysis.ranges import ranks_phrase
from rankscope.models.core import CallSite, Frame, NextStep, RankError, StacksReport, Verdict
from rankscope.models.flight import (
    FlightReport,
    FrDump,
    FrEntry,
    FrMismatch,
    FrProcessGroup,
    FrRankProgress,
    MismatchKind,
)

Matcher = Callable[[dict[str, Any], dict[str, Any], list[int], str], str | None]
"""(event_a, event_b, pg_ranks, pg_name) -> torchfrtrace's verdict for the pair, or None."""

SKILL = "skill/multi-node.md#flight-recorder"

NATIVE_STACK_STEP = NextStep(
    action="If it still runs, read that rank's native stack.",
    tool="dump_stacks",
    skill_section="skill/hangs.md#nccl-hangs",
)
"""The recorder's one step that reads native frames: the hang verdict, passing it on, asks the
call for them (analysis/hang/verdict_texts.py), which the step's words alone would not tell it."""


@dataclass(frozen=True)
class LoadedDump:
    """One file the shell managed to parse."""

    path: str
    rank: int
    format: Literal["pickle", "json"]
    data: dict[str, Any]


@dataclass
class _PG:
    name: str
    desc: str = ""
    ranks: set[int] = field(default_factory=set)
    # rank -> seq -> (entry, raw event)
    seqs: dict[int, dict[int, tuple[FrEntry, dict[str, Any]]]] = field(default_factory=dict)
    p2p: dict[int, dict[int, FrEntry]] = field(default_factory=dict)


def _parse_ranks(value: Any) -> list[int] | None:
    """pg_config ranks come as a string "[0, 1]" (NCCL and Gloo) or a list; Gloo may leave it empty."""
    if isinstance(value, list):
        items: Iterable[Any] = value
    elif isinstance(value, str) and value.strip():
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        if not isinstance(parsed, list):
            return None
        items = parsed
    else:
        return None
    out: list[int] = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            out.append(item)
        elif isinstance(item, str) and item.isdigit():
            out.append(int(item))
        else:
            return None
    return out


def _sizes(value: Any) -> list[list[int]]:
    if not isinstance(value, list):
        return []
    out: list[list[int]] = []
    for shape in value:
        if isinstance(shape, (list, tuple)):
            out.append([int(d) for d in shape if isinstance(d, int)])
    return out


def _strs(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _frames(value: Any) -> list[Frame]:
    frames: list[Frame] = []
    if not isinstance(value, list):
        return frames
    for fr in value:
        if not isinstance(fr, dict):
            continue
        line = fr.get("line")
        frames.append(
            Frame(
                function=str(fr.get("name", "?")),
                file=str(fr.get("filename", "?")),
                line=line if isinstance(line, int) else None,
            )
        )
    return frames


def user_call_site(frames: list[Frame]) -> CallSite | None:
    """Innermost recorded frame of the job's own code (not torch, another library or the stdlib)."""
    for fr in frames:
        if origin_of(fr.file) == "user":
            return CallSite(file=fr.file, line=fr.line, function=fr.function)
    return None


def _pg_of(event: dict[str, Any]) -> tuple[str, str]:
    pg = event.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        name = str(pg[0])
        desc = str(pg[1]) if len(pg) > 1 else ""
        return name, desc
    pg_id = event.get("pg_id")
    return (str(pg_id) if pg_id is not None else "?"), ""


def _completed(event: dict[str, Any], seq: int, last_completed: int | None) -> bool:
    if event.get("state") == "completed" or event.get("retired") is True:
        return True
    return last_completed is not None and not event.get("is_p2p") and seq <= last_completed


def _to_entry(rank: int, event: dict[str, Any], last_completed: int | None) -> FrEntry:
    name, desc = _pg_of(event)
    is_p2p = bool(event.get("is_p2p", False))
    seq_raw = event.get("p2p_seq_id" if is_p2p else "collective_seq_id", 0)
    seq = int(seq_raw) if isinstance(seq_raw, int) else 0
    frames = _frames(event.get("frames"))
    created = event.get("time_created_ns")
    timeout = event.get("timeout_ms")
    return FrEntry(
        rank=rank,
        process_group=name,
        pg_desc=desc,
        seq_id=seq,
        is_p2p=is_p2p,
        op=str(event.get("profiling_name", "?")),
        input_sizes=_sizes(event.get("input_sizes")),
        output_sizes=_sizes(event.get("output_sizes")),
        input_dtypes=_strs(event.get("input_dtypes")),
        output_dtypes=_strs(event.get("output_dtypes")),
        state=str(event.get("state", "")),
        completed=_completed(event, seq, last_completed),
        time_created_ns=created if isinstance(created, int) else None,
        timeout_ms=timeout if isinstance(timeout, int) else None,
        call_site=user_call_site(frames),
        frames=frames,
    )


def _normalise(dump: LoadedDump, pgs: dict[str, _PG]) -> FrDump:
    """Fold one dump into the per-group tables, repairing what Gloo leaves blank."""
    data = dump.data
    raw_entries = data.get("entries")
    entries = [e for e in raw_entries if isinstance(e, dict)] if isinstance(raw_entries, list) else []
    repaired: list[str] = []

    # pg_id -> last completed collective, from pg_status (keys are pg ids as strings)
    status = data.get("pg_status")
    last_done: dict[str, int] = {}
    if isinstance(status, dict):
        for pg_id, st in status.items():
            value = st.get("last_completed_collective") if isinstance(st, dict) else None
            if isinstance(value, str) and value.lstrip("-").isdigit():
                value = int(value)  # the JSON dump writes numbers as strings
            if isinstance(value, int):
                last_done[str(pg_id)] = value

    names_in_entries = list(dict.fromkeys(_pg_of(e) for e in entries))
    config = data.get("pg_config")
    if isinstance(config, dict):
        for key, cfg in config.items():
            cfg = cfg if isinstance(cfg, dict) else {}
            name = str(cfg.get("name") or key or "")
            desc = str(cfg.get("desc") or "")
            if not name:
                # Gloo: pg_config {"": {"name": "", "desc": "", ...}}; the entries carry the real name.
                if len(names_in_entries) == 1:
                    name, desc = names_in_entries[0]
                    repaired.append(f"pg_config had an empty name; used '{name}' from the entries")
                else:
                    repaired.append(
                        "pg_config had an empty name and the entries name several groups; ignored it"
                    )
                    continue
            ranks = _parse_ranks(cfg.get("ranks"))
            if ranks is None:
                repaired.append(f"pg_config of '{name}' had no usable ranks; took them from the dumps")
            pg = pgs.setdefault(name, _PG(name=name, desc=desc))
            pg.desc = pg.desc or desc
            if ranks:
                pg.ranks.update(ranks)
            pg.seqs.setdefault(dump.rank, {})

    for event in entries:
        name, desc = _pg_of(event)
        pg = pgs.setdefault(name, _PG(name=name, desc=desc))
        pg.desc = pg.desc or desc
        pg_id = event.get("pg_id")
        entry = _to_entry(dump.rank, event, last_done.get(str(pg_id)) if pg_id is not None else None)
        if entry.is_p2p:
            pg.p2p.setdefault(dump.rank, {})[entry.seq_id] = entry
            pg.seqs.setdefault(dump.rank, {})
        else:
            pg.seqs.setdefault(dump.rank, {})[entry.seq_id] = (entry, event)

    return FrDump(
        path=dump.path,
        rank=dump.rank,
        format=dump.format,
        version=str(data.get("version", "")),
        entries=len(entries),
        process_groups=sorted({_pg_of(e)[0] for e in entries}),
        repaired=repaired,
    )


def _where(entry: FrEntry) -> str:
    return f" at {entry.call_site.file}:{entry.call_site.line}" if entry.call_site else ""


def _minority(groups: dict[Any, list[int]]) -> list[int]:
    """Ranks outside the largest group; on a tie, outside the group holding the lowest rank."""
    ordered = sorted(groups.values(), key=lambda rs: (-len(rs), min(rs)))
    return sorted(r for rs in ordered[1:] for r in rs)


def _compare(pg: _PG, seq: int, have: list[int], matcher: Matcher | None) -> FrMismatch | None:
    entries = [pg.seqs[r][seq][0] for r in have]
    aspects: list[tuple[MismatchKind, Callable[[FrEntry], Any], str]] = [
        ("op_mismatch", lambda e: e.op, "different collectives"),
        ("size_mismatch", lambda e: (e.input_sizes, e.output_sizes), "different tensor sizes"),
        ("dtype_mismatch", lambda e: (e.input_dtypes, e.output_dtypes), "different dtypes"),
    ]
    for kind, key, what in aspects:
        groups: dict[Any, list[int]] = {}
        for e in entries:
            groups.setdefault(json.dumps(key(e)), []).append(e.rank)
        if len(groups) <= 1:
            continue
        suspects = _minority(groups)
        parts = []
        for ranks in sorted(groups.values(), key=lambda rs: min(rs)):
            e = pg.seqs[ranks[0]][seq][0]
            detail = (
                e.op
                if kind == "op_mismatch"
                else (
                    f"{e.op} in={e.input_sizes} out={e.output_sizes}"
                    if kind == "size_mismatch"
                    else f"{e.op} {e.input_dtypes}->{e.output_dtypes}"
                )
            )
            parts.append(f"{ranks_phrase(ranks)} {detail}{_where(e)}")
        frt = None
        if matcher is not None:
            base = next(r for r in have if r not in suspects)
            frt = matcher(
                pg.seqs[base][seq][1], pg.seqs[suspects[0]][seq][1], sorted(pg.ranks or have), pg.name
            )
        return FrMismatch(
            process_group=pg.name,
            pg_desc=pg.desc,
            seq_id=seq,
            kind=kind,
            ranks_entered=sorted(have),
            suspect_ranks=suspects,
            description=f"collective #{seq} of group {pg.name}: {what}: " + "; ".join(parts),
            torchfrtrace=frt,
            entries=entries,
        )
    return None


def _align(pg: _PG, matcher: Matcher | None) -> FrProcessGroup:
    members = sorted(pg.seqs)
    report = FrProcessGroup(
        name=pg.name, desc=pg.desc, ranks=sorted(pg.ranks | set(members)), ranks_with_dumps=members
    )
    for r in members:
        seqs = pg.seqs[r]
        done = [s for s, (e, _) in seqs.items() if e.completed]
        pending = sorted(s for s, (e, _) in seqs.items() if not e.completed)
        p2p = pg.p2p.get(r, {})
        p2p_pending = sorted(s for s, e in p2p.items() if not e.completed)
        report.progress.append(
            FrRankProgress(
                rank=r,
                process_group=pg.name,
                last_entered=max(seqs) if seqs else None,
                last_completed=max(done) if done else None,
                pending_op=f"{seqs[pending[0]][0].op} #{pending[0]}" if pending else None,
                pending_p2p=f"{p2p[p2p_pending[0]].op} #{p2p_pending[0]}" if p2p_pending else None,
            )
        )
    nonempty = [pg.seqs[r] for r in members if pg.seqs[r]]
    if not nonempty:
        return report
    lo = max(min(s) for s in nonempty)  # older entries may have left some ring buffers
    hi = max(max(s) for s in nonempty)
    report.aligned_from, report.aligned_to = lo, hi
    for seq in range(lo, hi + 1):
        have = [r for r in members if seq in pg.seqs[r]]
        lack = [r for r in members if seq not in pg.seqs[r]]
        if not have:
            continue
        if lack:
            first = pg.seqs[have[0]][seq][0]
            extra = len(lack) > len(have)
            suspects = sorted(have) if extra else sorted(lack)
            if extra:
                text = (
                    f"{ranks_phrase(have)} entered {first.op} #{seq} of group {pg.name}{_where(first)}, "
                    f"which {ranks_phrase(lack)} never entered: {ranks_phrase(have)} called a collective the others did not"
                )
            else:
                text = (
                    f"{ranks_phrase(lack)} never entered {first.op} #{seq} of group {pg.name} that "
                    f"{ranks_phrase(have)} entered{_where(first)}: skipped it, or stuck before it"
                )
            report.first_mismatch = FrMismatch(
                process_group=pg.name,
                pg_desc=pg.desc,
                seq_id=seq,
                kind="not_entered",
                ranks_entered=sorted(have),
                ranks_not_entered=sorted(lack),
                suspect_ranks=suspects,
                description=text,
                entries=[pg.seqs[r][seq][0] for r in have],
            )
            return report
        mismatch = _compare(pg, seq, have, matcher)
        if mismatch is not None:
            report.first_mismatch = mismatch
            return report
    return report


# -- point-to-point ----------------------------------------------------------------------------

_P2P_NAME = re.compile(r"^[\w-]+:(send|recv) (\d+)(?:->|<-)(\d+)$")
"""``nccl:send 0->1`` (this rank -> dst), ``nccl:recv 1<-0`` (this rank <- src): group ranks."""


@dataclass(frozen=True)
class _P2POp:
    entry: FrEntry
    direction: str
    peer: int


def _p2p_op(entry: FrEntry, pg_ranks: list[int]) -> _P2POp | None:
    """The direction and the peer's global rank of a recorded send/recv (None: coalesced etc.)."""
    m = _P2P_NAME.match(entry.op)
    if m is None:
        return None
    local_peer = int(m.group(3))
    peer = pg_ranks[local_peer] if local_peer < len(pg_ranks) else local_peer
    return _P2POp(entry=entry, direction=m.group(1), peer=peer)


def _tensor_sizes(entry: FrEntry) -> list[list[int]]:
    return entry.input_sizes or entry.output_sizes


def _label(op: _P2POp) -> str:
    return f"{op.entry.op} #{op.entry.seq_id}{_where(op.entry)}"


def _p2p_mismatch(pg: _PG, dumped: set[int], pending_elsewhere: dict[int, str]) -> FrMismatch | None:
    """The first send/recv of a group that can never complete, judged from pending entries.

    ``p2p_seq_id`` counts each rank's own sends and recvs, so entries are paired by peer,
    not by number: a rank's oldest pending send/recv needs the opposite op, naming this
    rank, pending on its peer. In order: a cycle of waits (deadlock), a peer that never
    posted the other side, then a pair whose tensor sizes differ. ``pending_elsewhere``:
    rank -> the collective it waits in (any group), to say what an unmatched peer does.
    """
    pg_ranks = sorted(pg.ranks)
    pending: dict[int, list[_P2POp]] = {}
    for rank, entries in sorted(pg.p2p.items()):
        ops = [
            op
            for seq in sorted(entries)
            if (op := _p2p_op(entries[seq], pg_ranks)) and not op.entry.completed
        ]
        if ops:
            pending[rank] = ops
    if not pending:
        return None
    first = {rank: ops[0] for rank, ops in pending.items()}
    waits: Waits = {rank: (op.direction, op.peer) for rank, op in first.items()}
    cycle = find_cycle(waits)
    if cycle is not None:
        return FrMismatch(
            process_group=pg.name,
            pg_desc=pg.desc,
            seq_id=first[cycle[0]].entry.seq_id,
            is_p2p=True,
            kind="p2p_deadlock",
            ranks_entered=sorted(cycle),
            suspect_ranks=sorted(cycle),
            description=f"group {pg.name}: {cycle_phrase(cycle, waits)}",
            entries=[first[r].entry for r in cycle],
        )
    size_mismatch: FrMismatch | None = None
    for rank in sorted(first, key=lambda r: (first[r].entry.time_created_ns or 0, r)):
        op = first[rank]
        peer = op.peer
        if peer not in dumped:
            continue  # no dump for the peer: reported as a missing rank
        other = next(
            (o for o in pending.get(peer, []) if o.peer == rank and o.direction != op.direction), None
        )
        if other is None:
            return _unmatched(pg, rank, op, first.get(peer), pending_elsewhere)
        if size_mismatch is None and _tensor_sizes(op.entry) != _tensor_sizes(other.entry):
            size_mismatch = _size_mismatch(pg, rank, op, other)
    return size_mismatch


def _size_mismatch(pg: _PG, rank: int, op: _P2POp, other: _P2POp) -> FrMismatch:
    """A send and its matching recv, posted with different tensor sizes."""
    peer = op.peer
    return FrMismatch(
        process_group=pg.name,
        pg_desc=pg.desc,
        seq_id=op.entry.seq_id,
        is_p2p=True,
        kind="size_mismatch",
        ranks_entered=sorted({rank, peer}),
        suspect_ranks=sorted({rank, peer}),
        description=(
            f"rank {rank} {verb(op.direction)} rank {peer} with sizes {_tensor_sizes(op.entry)} "
            f"({_label(op)}), rank {peer} {verb(other.direction)} rank {rank} with sizes "
            f"{_tensor_sizes(other.entry)} ({_label(other)}): a send and its recv must have the same "
            "size and dtype"
        ),
        entries=[op.entry, other.entry],
    )


def _unmatched(
    pg: _PG, rank: int, op: _P2POp, theirs: _P2POp | None, pending_elsewhere: Mapping[int, str]
) -> FrMismatch:
    """A pending send/recv whose peer never posted the opposite op: say what the peer does instead."""
    peer = op.peer
    opposite = "recv" if op.direction == "send" else "send"
    if theirs is not None:
        doing = f"rank {peer} {verb(theirs.direction)} rank {theirs.peer} ({_label(theirs)})"
    elif peer in pending_elsewhere:
        doing = f"rank {peer} waits in {pending_elsewhere[peer]}"
    else:
        doing = f"rank {peer} has no send, recv or collective pending"
    return FrMismatch(
        process_group=pg.name,
        pg_desc=pg.desc,
        seq_id=op.entry.seq_id,
        is_p2p=True,
        kind="p2p_wrong_peer" if theirs is not None or peer in pending_elsewhere else "p2p_unmatched",
        ranks_entered=[rank],
        ranks_not_entered=[peer],
        suspect_ranks=[peer],
        description=(
            f"rank {rank} {verb(op.direction)} rank {peer} ({op.entry.op} #{op.entry.seq_id} of group "
            f"{pg.name}{_where(op.entry)}), but {doing}: "
            f"rank {peer} never posted the matching {opposite}"
        ),
        entries=[op.entry, *([theirs.entry] if theirs is not None else [])],
    )


def _earliest(mismatches: list[FrMismatch]) -> FrMismatch | None:
    def key(m: FrMismatch) -> tuple[int, int]:
        times = [e.time_created_ns for e in m.entries if e.time_created_ns is not None]
        return (min(times) if times else 2**63, m.seq_id)

    return min(mismatches, key=key) if mismatches else None


def _steps(kind: str) -> list[NextStep]:
    steps = [
        NextStep(
            action="Open the suspect rank's recorded call site and the code path that leads to it on that rank only.",
            skill_section=SKILL,
        )
    ]
    if kind in ("all_in_same_collective", "missing_ranks"):
        steps.append(
            NextStep(
                action="Collect the dumps of the ranks not seen here (other hosts), or the live stacks of every host.",
                tool="dump_stacks",
                skill_section="skill/multi-node.md#cross-host-collection",
            )
        )
    steps.append(
        NextStep(
            action="Read the job's logs for the first error of each rank.",
            tool="triage_logs",
            skill_section=SKILL,
        )
    )
    return steps


def _verdict(
    first: FrMismatch | None, pgs: list[FrProcessGroup], ranks: list[int], missing: list[int]
) -> Verdict:
    evidence: list[str] = []
    if missing:
        evidence.append(f"no readable dump for {ranks_phrase(missing)}")
    if not ranks:
        return Verdict(
            kind="inconclusive",
            summary="no flight-recorder dump could be read",
            evidence=evidence,
            next_steps=[
                NextStep(
                    action="Enable the recorder (rankscope.probe.enable_flight_recorder or TORCH_FR_BUFFER_SIZE) and dump again.",
                    skill_section=SKILL,
                )
            ],
        )
    if first is not None:
        for e in first.entries:
            where = f" at {e.call_site}" if e.call_site else ""
            evidence.append(
                f"rank {e.rank}: {e.op} #{e.seq_id} in={e.input_sizes} {e.input_dtypes} state={e.state}"
                f"{' completed' if e.completed else ' not completed'}{where}"
            )
        if first.torchfrtrace:
            evidence.append(f"torchfrtrace: {first.torchfrtrace}")
        kind = (
            "divergent_ranks" if first.kind in ("not_entered", "p2p_unmatched") else "mismatched_collectives"
        )
        return Verdict(
            kind=kind,
            suspect_ranks=first.suspect_ranks,
            summary=first.description,
            evidence=evidence,
            next_steps=_steps(kind),
        )
    if missing:
        return Verdict(
            kind="missing_ranks",
            suspect_ranks=missing,
            summary=(
                f"the dumps that exist agree, but {ranks_phrase(missing)} left no dump: "
                "they exited or hung before dumping, or their files are on another host"
            ),
            evidence=evidence,
            next_steps=_steps("missing_ranks"),
        )
    pending = [(p.rank, op) for g in pgs for p in g.progress for op in (p.pending_op, p.pending_p2p) if op]
    if pending:
        ops = sorted({op for _, op in pending if op})
        evidence.append("pending: " + "; ".join(f"rank {r}: {op}" for r, op in sorted(pending)))
        return Verdict(
            kind="all_in_same_collective",
            summary=(
                f"every rank recorded the same collectives and waits in {', '.join(ops)}: the cause is outside "
                "the recorded calls (network or NCCL, a GPU, or a rank whose dump is not here)"
            ),
            evidence=evidence,
            next_steps=_steps("all_in_same_collective"),
        )
    return Verdict(
        kind="no_collective",
        summary="every recorded collective matched on all ranks and completed: no rank is waiting in one",
        evidence=evidence,
        next_steps=[
            NextStep(
                action="Take live stacks: the job is busy outside collectives.",
                tool="dump_stacks",
                skill_section=SKILL,
            )
        ],
    )


# -- the story: what the ranks did differently, and which GPU never started -----------------------

_Key = tuple[str, str]


def _key(e: FrEntry) -> _Key:
    return e.op, json.dumps(e.input_sizes)


def _period(keys: list[_Key]) -> int | None:
    """The shortest p that repeats through ``keys`` at least twice (one training step's collectives)."""
    for p in range(1, len(keys) // 2 + 1):
        if all(keys[i] == keys[i + p] for i in range(len(keys) - p)):
            return p
    return None


def _per_op(diff: Counter[_Key], word: str) -> list[str]:
    """``4 fewer nccl:all_reduce (in=[[1]], in=[[256]], 2x in=[[4096]])``: a count difference per op."""
    by_op: dict[str, list[tuple[str, int]]] = {}
    for (op, sizes), n in sorted(diff.items()):
        by_op.setdefault(op, []).append((sizes, n))
    return [
        f"{sum(n for _, n in items)} {word} {op} ("
        + ", ".join(f"{n}x in={sizes}" if n > 1 else f"in={sizes}" for sizes, n in items)
        + ")"
        for op, items in by_op.items()
    ]


def count_story(pg: _PG, suspects: list[int], upto: int) -> str | None:
    """How the suspects' recorded collectives differ in number from the others', per op and shape.

    Counted over the window every rank's ring buffer still holds; with a repeating pattern (a step),
    a difference of whole steps is named as such: rank 1 has 4 fewer all_reduces, one step of 4.
    """
    members = [r for r in pg.seqs if pg.seqs[r]]
    others = [r for r in members if r not in suspects]
    if not others or not suspects:
        return None
    lo = max(min(pg.seqs[r]) for r in members)
    counts = {r: Counter(_key(e) for s, (e, _) in pg.seqs[r].items() if s >= lo) for r in members}
    if any(counts[o] != counts[others[0]] for o in others[1:]):
        return None  # the others disagree among themselves: no one reference to compare with
    ref = counts[others[0]]
    base = others[0]
    steps = _period([_key(pg.seqs[base][s][0]) for s in range(lo, upto) if s in pg.seqs[base]])
    parts: list[str] = []
    for r in suspects:
        if r not in counts:
            continue
        fewer, more = ref - counts[r], counts[r] - ref
        said = [*_per_op(fewer, "fewer"), *_per_op(more, "more")]
        if not said:
            continue
        missing = sum(fewer.values()) - sum(more.values())
        whole = ""
        if steps and missing > 0 and missing % steps == 0:
            n = missing // steps
            whole = (
                f": {'one step' if n == 1 else f'{n} steps'}'s worth (the recorded pattern repeats every "
                f"{steps} collectives)"
            )
        parts.append(f"rank {r} recorded {', '.join(said)} than {ranks_phrase(others)}{whole}")
    if not parts:
        return None
    return "; ".join(parts) + f" (counted from #{lo}, the oldest entry every dump holds)"


def _not_started(pgs: dict[str, _PG], groups: list[FrProcessGroup]) -> Verdict | None:
    """With TORCH_NCCL_ENABLE_TIMING, a rank whose oldest pending collective is still ``scheduled``
    while the others' is ``started``: its GPU never reached the collective."""
    for group in groups:
        pg = pgs[group.name]
        pending = {p.rank: p.pending_op for p in group.progress if p.pending_op}
        seqs = {int(op.rsplit("#", 1)[1]) for op in pending.values()}
        if len(seqs) != 1:
            continue
        seq = seqs.pop()
        states = {r: pg.seqs[r][seq][0].state for r in pending if seq in pg.seqs[r]}
        late = sorted(r for r, st in states.items() if st == "scheduled")
        started = sorted(r for r, st in states.items() if st == "started")
        if not late or not started:
            continue
        entry = pg.seqs[late[0]][seq][0]
        who = ranks_phrase(late)
        return Verdict(
            kind="divergent_ranks",
            suspect_ranks=late,
            confidence="high",
            summary=(
                f"{who}'s GPU never started {entry.op} #{seq} of group {pg.name}: the entry is 'scheduled' while "
                f"{ranks_phrase(started)} have it 'started' (TORCH_NCCL_ENABLE_TIMING). {who}'s GPU was still "
                "busy with earlier work (a kernel queued before the collective that did not finish: a long or "
                "endless kernel, a GPU fault); the others wait for it"
            ),
            evidence=[
                f"rank {r}: {pg.seqs[r][seq][0].op} #{seq} state={st}" for r, st in sorted(states.items())
            ],
            next_steps=[
                NextStep(
                    action=f"Find the GPU work {who} queued before #{seq} (the collective is called{_where(entry)}): "
                    "a kernel that loops, waits on a flag, or faulted; check the node's GPU and kernel log.",
                    tool="collect_env",
                    skill_section="skill/hangs.md#nccl-hangs",
                ),
                NATIVE_STACK_STEP.model_copy(),
            ],
        )
    return None


_SPECIFIC = ("mismatched_collectives", "divergent_ranks", "missing_ranks")


def _merge_stacks(verdict: Verdict, stacks: StacksReport) -> Verdict:
    """Fold a live stacks verdict in: the recorder tells history, the stacks tell now."""
    live = stacks.verdict
    evidence = [*verdict.evidence, f"live stacks ({live.kind}): {live.summary}"]
    if verdict.kind not in _SPECIFIC and live.kind in _SPECIFIC:
        return Verdict(
            kind=live.kind,
            suspect_ranks=live.suspect_ranks,
            summary=f"{live.summary} (from live stacks; the recorder saw: {verdict.summary})",
            evidence=evidence,
            next_steps=[*live.next_steps, *verdict.next_steps],
        )
    if verdict.kind in _SPECIFIC and live.kind in _SPECIFIC:
        agree = set(verdict.suspect_ranks) & set(live.suspect_ranks)
        evidence.append(
            f"recorder and live stacks agree on {ranks_phrase(agree)}"
            if agree
            else "recorder and live stacks name different ranks: the recorder shows the first divergence, "
            "the stacks where each rank is now"
        )
    return verdict.model_copy(update={"evidence": evidence})


def analyze(
    dumps: list[LoadedDump],
    errors: list[RankError] | None = None,
    *,
    stacks: StacksReport | None = None,
    matcher: Matcher | None = None,
    world_size: int | None = None,
) -> FlightReport:
    """Align the dumps per process group and return the report with its verdict."""
    errors = list(errors or [])
    pgs: dict[str, _PG] = {}
    by_rank: dict[int, LoadedDump] = {}
    notes: list[str] = []
    for d in sorted(dumps, key=lambda d: (d.rank, d.path)):
        if d.rank in by_rank:
            notes.append(f"two dumps for rank {d.rank}: used {by_rank[d.rank].path}, ignored {d.path}")
            continue
        by_rank[d.rank] = d
    infos = [_normalise(d, pgs) for d in by_rank.values()]
    ranks = sorted(by_rank)

    world: set[int] = set()
    for pg in pgs.values():
        world |= pg.ranks
    if world_size is None and world:
        world_size = max(world) + 1
    if world_size is None and ranks:
        world_size = max(ranks) + 1
    missing = sorted(set(range(world_size or 0)) - set(ranks))

    ordered = sorted(pgs.values(), key=lambda p: (len(p.name), p.name))
    groups = [_align(pg, matcher) for pg in ordered]
    waiting_in = {
        p.rank: f"{p.pending_op} of group {g.name}" for g in groups for p in g.progress if p.pending_op
    }
    for pg, group in zip(ordered, groups, strict=True):
        group.p2p_mismatch = _p2p_mismatch(pg, set(ranks), waiting_in)
    first = _earliest([m for g in groups for m in (g.first_mismatch, g.p2p_mismatch) if m is not None])
    verdict = _verdict(first, groups, ranks, missing)
    if verdict.kind == "all_in_same_collective":
        verdict = _not_started(pgs, groups) or verdict
    elif first is not None and not first.is_p2p and first.process_group in pgs:
        story = count_story(pgs[first.process_group], first.suspect_ranks, first.seq_id)
        if story:
            verdict = verdict.model_copy(
                update={"summary": f"{verdict.summary}. {story}", "evidence": [*verdict.evidence, story]}
            )
    # A rank "never entered" a collective may be stuck before it in a send/recv: say so too.
    also = [f"also: {g.p2p_mismatch.description}" for g in groups if g.p2p_mismatch not in (None, first)]
    if also:
        verdict = verdict.model_copy(update={"evidence": [*verdict.evidence, *also]})
    unread = sorted(
        {
            e.op
            for pg in pgs.values()
            for es in pg.p2p.values()
            for e in es.values()
            if not _P2P_NAME.match(e.op)
        }
    )
    if unread:
        notes.append(
            f"p2p entries without a readable peer ({', '.join(unread)}, e.g. from batch_isend_irecv) are listed "
            "per rank but not paired across ranks"
        )
    if stacks is not None:
        verdict = _merge_stacks(verdict, stacks)
    return FlightReport(
        dumps=infos,
        world_size=world_size,
        ranks=ranks,
        missing_ranks=missing,
        process_groups=groups,
        first_mismatch=first,
        verdict=verdict,
        stacks_verdict=stacks.verdict if stacks is not None else None,
        errors=errors,
        notes=notes,
    )
