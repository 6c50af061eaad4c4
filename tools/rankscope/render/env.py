"""Lines for a person: the text view of `rankscope env` (typed on its model; pure)."""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.analysis.units import fmt_bytes
from rankscope.models.env import EnvReport


def render_env(r: EnvReport) -> Iterator[str]:
    """Human view: findings first (they are the point), then node facts and the per-rank table."""
    n = r.node
    if r.findings:
        yield "Findings:"
        for f in r.findings:
            ranks = f" (ranks {','.join(map(str, f.ranks))})" if f.ranks else ""
            yield f"  [{f.severity.upper()}] {f.kind}{ranks}: {f.message}"
            if f.fix:
                yield f"      fix: {f.fix}"
        yield ""
    yield f"Node {n.hostname}: {n.os}, kernel {n.kernel}, {n.cpus} CPUs ({n.cpus_usable} usable)"
    yield f"  memory {fmt_bytes(n.memory_total_bytes)} ({fmt_bytes(n.memory_available_bytes)} available), /dev/shm {fmt_bytes(n.shm.size_bytes)} ({fmt_bytes(n.shm.used_bytes)} used)"
    lim = n.limits
    yield f"  ulimits: open files {lim.open_files_soft or 'unlimited'}, locked memory {lim.locked_memory_soft if lim.locked_memory_soft is not None else 'unlimited'}"
    yield f"  python {n.python}"
    if n.torch is not None:
        t = n.torch
        if t.available:
            backends = ", ".join(k for k, v in t.backends.items() if v) or "none"
            yield f"  torch {t.version} (CUDA {t.cuda or '-'}, NCCL {t.nccl or '-'}, cuDNN {t.cudnn or '-'}); backends: {backends}"
        else:
            yield f"  torch: {t.error}"
    if n.gpus:
        for g in n.gpus:
            yield f"  GPU{g.index} {g.name} {g.memory_used_mib}/{g.memory_total_mib} MiB, driver {g.driver_version}, uncorrected ECC {g.ecc_uncorrected_volatile}"
    else:
        yield f"  GPUs: {n.gpu_note}"
    if n.xid_note:
        yield f"  Xid: {n.xid_note}"
    for ev in n.xid_events[-5:]:
        yield f"  Xid {ev.xid} {ev.pci}: {ev.detail[:100]}"
    yield "  interfaces: " + ", ".join(
        f"{i.name}[{i.state}] {' '.join(i.addresses[:2])}".strip() for i in n.interfaces
    )
    if n.infiniband:
        yield "  infiniband: " + ", ".join(
            f"{d.name}:" + "/".join(f"{p.port}={p.state}" for p in d.ports) for d in n.infiniband
        )
    if r.ranks:
        yield ""
        yield "Ranks:" if r.job else "This shell's distributed variables:"
        # a bounded answer leaves out what a rank shares with the first one: say so, not "None"
        folded = any(note.startswith("ranks[1:]") for note in r.left_out)
        for i, rk in enumerate(r.ranks):
            same = f"as rank {r.ranks[0].rank}" if folded and i else "?"
            python, torch = rk.python or same, rk.torch_version or same
            yield f"  rank {rk.rank} (local {rk.local_rank}) pid {rk.pid} on {rk.host}: {python}, torch {torch}, {rk.children} children"
            if rk.error:
                yield f"      {rk.error}"
            for k, v in rk.env.items():
                yield f"      {k}={v}"
    if r.differences:
        yield ""
        yield "Differences between ranks:"
        for d in r.differences:
            yield f"  {d.name}: " + ", ".join(
                f"rank {k}={v if v is not None else '<unset>'}" for k, v in d.values.items()
            )
    for e in r.errors:
        yield f"error: {e}"
