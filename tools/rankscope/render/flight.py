"""Lines for a person: the text view of `rankscope fr` (typed on its model; pure)."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.analysis.ranges import merge_rank_lines
from rankscope.models.flight import FlightReport
from rankscope.render.next_steps import render_next_steps


def render_flight(r: FlightReport) -> Iterator[str]:
    """Verdict first, then the first disagreement with each rank's entry, then how far each rank got."""
    read = r.dumps_read or len(r.dumps)  # a bounded answer lists fewer dumps than it read
    yield f"Read {read} dump(s): ranks {','.join(map(str, r.ranks)) or '-'} of world {r.world_size or '?'}"
    if r.missing_ranks:
        yield f"No dump for ranks: {','.join(map(str, r.missing_ranks))}"
    for err in r.errors:
        yield f"  unreadable: {err.message}"
    yield ""
    v = r.verdict
    yield f"Verdict: {v.kind}  suspects: {','.join(map(str, v.suspect_ranks)) or '-'}"
    yield f"  {v.summary}"
    for line in merge_rank_lines(v.evidence):  # ranks that recorded the same entry: one line
        if line not in v.summary:
            yield f"  - {line}"
    m = r.first_mismatch
    if m is not None:
        yield ""
        what = "send/recv" if m.is_p2p else "collective"
        yield f"First disagreement: group {m.process_group} ({m.pg_desc or '-'}) {what} #{m.seq_id}: {m.kind}"
        for e in m.entries:
            where = f" at {e.call_site}" if e.call_site else ""
            yield (
                f"  rank {e.rank}: {e.op} in={e.input_sizes} {e.input_dtypes} out={e.output_sizes} "
                f"state={e.state}{' (done)' if e.completed else ''}{where}"
            )
        if m.ranks_not_entered:
            never = "never posted the other side" if m.is_p2p else "never entered"
            yield f"  {never}: ranks {','.join(map(str, m.ranks_not_entered))}"
        suspect = next((e for e in m.entries if e.rank in m.suspect_ranks and e.frames), None)
        if suspect is not None:
            yield f"  recorded stack of rank {suspect.rank}:"
            for f in suspect.frames[:12]:
                yield f"    {f.function} ({f.where()})"
    yield ""
    for g in r.process_groups:
        span = f"#{g.aligned_from}..#{g.aligned_to}" if g.aligned_from is not None else "no entries"
        yield f"Group {g.name} ({g.desc or '-'}), ranks {','.join(map(str, g.ranks))}, aligned {span}"
        for p in g.progress:
            pending = f", waiting in {p.pending_op}" if p.pending_op else ""
            p2p = f", send/recv pending: {p.pending_p2p}" if p.pending_p2p else ""
            yield f"  rank {p.rank}: entered #{p.last_entered}, completed #{p.last_completed}{pending}{p2p}"
    for n in r.notes:
        yield f"note: {n}"
    yield from render_next_steps(v.next_steps)
