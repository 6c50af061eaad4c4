"""Placement math: FSDP coverage of a model, and whether checkpoint chunks tile their tensors.

Pure: works on ``TensorPlacement``/``Chunk`` models collected elsewhere (the
probe inside the job, or the DCP metadata reader).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rankscope.models.placements import Chunk, CoverageSummary, ModuleWrapping, SizedName, TensorPlacement

ADAM_BYTES_PER_ELEMENT = 8
"""exp_avg and exp_avg_sq, both fp32, per parameter element."""

ROOT_UNIT_WARN_SHARE = 0.5
"""A single FSDP unit gathering more than this share of the model defeats sharding at peak."""


def _owner_unit(fqn: str, units: Sequence[str]) -> str | None:
    """The innermost FSDP unit whose module contains parameter ``fqn``."""
    best: str | None = None
    for u in units:
        if u == "" or fqn.startswith(u + "."):
            if best is None or len(u) > len(best):
                best = u
    return best


def coverage(
    tensors: Sequence[TensorPlacement],
    wrapping: Sequence[ModuleWrapping],
    modules: Sequence[tuple[str, bool]] = (),
    top: int = 5,
) -> CoverageSummary:
    """Share of parameter bytes sharded / replicated / plain, FSDP units, per-rank estimates.

    ``modules`` lists (module fqn, is_container) for every submodule in
    ``named_modules`` order; containers (ModuleList, ModuleDict, Sequential) are
    looked through when naming the modules that are not their own FSDP unit.
    """
    params = [t for t in tensors if t.kind == "param"]
    total = sum(t.global_bytes for t in params)
    by_layout = {"sharded": 0, "replicated": 0, "plain": 0, "partial": 0}
    for t in params:
        by_layout[t.layout] += t.global_bytes
    unsharded = sorted((t for t in params if t.layout != "sharded"), key=lambda t: -t.global_bytes)
    units = sorted(w.fqn for w in wrapping if w.wrapping in ("fsdp2", "fsdp1"))
    summary = CoverageSummary(
        param_bytes=total,
        sharded_share=_share(by_layout["sharded"], total),
        replicated_share=_share(by_layout["replicated"] + by_layout["partial"], total),
        plain_share=_share(by_layout["plain"], total),
        largest_unsharded=[SizedName(name=t.fqn, bytes=t.global_bytes) for t in unsharded[:top]],
        fsdp_units=units,
        est_param_bytes_per_rank=sum(t.local_bytes for t in params),
        est_grad_bytes_per_rank=sum(t.local_bytes for t in params if t.requires_grad),
        est_adam_state_bytes_per_rank=sum(
            ADAM_BYTES_PER_ELEMENT * math.prod(t.local_shape) for t in params if t.requires_grad
        ),
    )
    if units:
        owner = {t.fqn: _owner_unit(t.fqn, units) for t in params}
        per_unit: dict[str, int] = dict.fromkeys(units, 0)
        for t in params:
            if owner[t.fqn] is not None:
                per_unit[owner[t.fqn]] += t.global_bytes  # type: ignore[index]
        name, size = max(per_unit.items(), key=lambda kv: (kv[1], -len(kv[0])))
        summary.largest_unit = SizedName(name=name or "<root>", bytes=size)
        share = _share(size, total)
        if share > ROOT_UNIT_WARN_SHARE:
            summary.modules_not_own_unit = _gathered_with(name, units, modules, params, owner)[: top * 4]
        if share > ROOT_UNIT_WARN_SHARE and summary.modules_not_own_unit:
            biggest = summary.modules_not_own_unit[0].name
            if name == "" and len(units) == 1:
                summary.warnings.append(
                    f"one FSDP unit (the root) holds {share:.0%} of the parameter bytes: fully_shard applied at the "
                    "root only all-gathers the whole model at once; apply fully_shard to each block (e.g. every "
                    "transformer layer) before the root"
                )
            else:
                summary.warnings.append(
                    f"FSDP unit {summary.largest_unit.name} gathers {share:.0%} of the parameter bytes at once; "
                    f"its largest submodule that is not its own unit is {biggest}"
                )
    if total and by_layout["plain"] and (by_layout["sharded"] or units):
        plain = [t for t in unsharded if t.layout == "plain"]
        summary.warnings.append(
            f"{_share(by_layout['plain'], total):.0%} of the parameter bytes are plain tensors outside any DTensor "
            f"sharding (largest: {plain[0].fqn})"
        )
    return summary


def _gathered_with(
    unit: str,
    units: Sequence[str],
    modules: Sequence[tuple[str, bool]],
    params: Sequence[TensorPlacement],
    owner: dict[str, str | None],
) -> list[SizedName]:
    """Submodules whose parameters ``unit`` all-gathers with its own: direct children, looking through containers."""
    unit_set = set(units)
    containers = {fqn for fqn, is_container in modules if is_container}

    def parent(fqn: str) -> str:
        return fqn.rsplit(".", 1)[0] if "." in fqn else ""

    def attached(fqn: str) -> bool:
        p = parent(fqn)
        while p in containers and p != unit:
            p = parent(p)
        return p == unit

    out: list[SizedName] = []
    for fqn, is_container in modules:
        if not fqn or fqn in unit_set or is_container or not attached(fqn):
            continue
        owned = sum(t.global_bytes for t in params if t.fqn.startswith(fqn + ".") and owner[t.fqn] == unit)
        if owned:
            out.append(SizedName(name=fqn, bytes=owned))
    return sorted(out, key=lambda s: -s.bytes)


def _share(part: int, total: int) -> float:
    return round(part / total, 4) if total else 0.0


def tiling_problems(
    fqn: str, global_shape: Sequence[int], chunks: Sequence[Chunk], *, replicas_allowed: bool = False
) -> list[str]:
    """Chunks out of bounds, overlapping, or leaving gaps in their tensor.

    With ``replicas_allowed`` (per-rank placement reports) identical chunks are
    replicas, not overlaps; a checkpoint stores each piece once.
    """
    problems: list[str] = []
    ndim = len(global_shape)
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for c in chunks:
        if len(c.offsets) != ndim or len(c.sizes) != ndim:
            problems.append(f"{fqn}: chunk at {c.offsets} has {len(c.sizes)} dims, the tensor has {ndim}")
            continue
        if any(o < 0 or o + s > g for o, s, g in zip(c.offsets, c.sizes, global_shape, strict=True)):
            problems.append(
                f"{fqn}: chunk offsets {c.offsets} sizes {c.sizes} fall outside the global shape {list(global_shape)}"
            )
            continue
        box = (tuple(c.offsets), tuple(c.sizes))
        if replicas_allowed and box in boxes:
            continue
        boxes.append(box)
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if _overlap(boxes[i], boxes[j]):
                problems.append(
                    f"{fqn}: chunks at offsets {list(boxes[i][0])} and {list(boxes[j][0])} overlap"
                )
    covered = sum(math.prod(s) for _, s in boxes)
    total = math.prod(global_shape)
    if not any("overlap" in p for p in problems) and covered < total:
        problems.append(f"{fqn}: chunks cover {covered} of {total} elements: part of the tensor is missing")
    return problems


def _overlap(a: tuple[tuple[int, ...], tuple[int, ...]], b: tuple[tuple[int, ...], tuple[int, ...]]) -> bool:
    (oa, sa), (ob, sb) = a, b
    if 0 in sa or 0 in sb:
        return False
    return all(oa[d] < ob[d] + sb[d] and ob[d] < oa[d] + sa[d] for d in range(len(oa)))
