"""Models of tensor consistency across ranks: each rank's fingerprints, and what differs where.

``ConsistencyReport`` is the answer of ``rankscope.probe.check_consistency``
(identical on every rank) and of ``rankscope compare`` / MCP
``check_tensor_consistency``. The placement models are in ``models/placements.py``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.core import Model, NextStep

TensorKind = Literal["param", "grad", "buffer", "tensor", "optim", "state"]
Which = Literal["params", "grads", "buffers", "all"]


class Fingerprint(Model):
    """What one rank knows about one tensor, small enough to exchange for thousands of tensors."""

    name: str
    kind: TensorKind = "tensor"
    shape: list[int]
    dtype: str
    numel: int = 0
    checksum: str = Field(
        description="CRC-32 and length of the tensor's bytes (local shard for a DTensor): exact equality."
    )
    sum: float | None = Field(
        default=None,
        description="Sum (fp32/fp64 accumulation for floats, int64 for integers); NaN/Inf when present.",
    )
    abs_max: float | None = None
    nan: int = 0
    inf: int = 0
    dtensor: bool = False
    placements: list[str] | None = Field(
        default=None, description="DTensor placements, e.g. ['Shard(dim=0)', 'Replicate()']."
    )
    mesh_dim_names: list[str] | None = None
    shard_key: str | None = Field(
        default=None,
        description="Coordinates of this rank along the mesh dims that are not Replicate: ranks with the same key hold "
        "replicas of the same local shard and are the only ones compared.",
    )
    partial: bool = Field(
        default=False, description="A Partial placement: local values are pending a reduction."
    )


class RankFingerprints(Model):
    """One rank's fingerprints, as exchanged in the gather and as written by ``dump``."""

    format: Literal["rankscope-fingerprints"] = "rankscope-fingerprints"
    rank: int
    world_size: int
    job_id: str | None = None
    host: str | None = None
    which: str = "params"
    fingerprints: list[Fingerprint] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class RankValue(Model):
    """A tensor's summary on one rank, to show how the ranks disagree."""

    rank: int
    checksum: str | None = None
    shape: list[int] | None = None
    dtype: str | None = None
    sum: float | None = None
    abs_max: float | None = None
    nan: int = 0
    inf: int = 0
    max_abs_diff: float | None = Field(
        default=None, description="Max |x - reference| (second phase, max_diff=True)."
    )


class DivergentTensor(Model):
    """A tensor whose value differs on some ranks from the majority of its replica group."""

    name: str
    ranks: list[int] = Field(description="Ranks that disagree with the majority (the reference).")
    reference_ranks: list[int] = Field(default_factory=list, description="Ranks holding the majority value.")
    tie: bool = Field(
        default=False, description="No strict majority: the reference is the group of the lowest rank."
    )
    reason: Literal["shape", "dtype", "values", "nonfinite", "no_grad", "not_averaged"] = Field(
        default="values",
        description="not_averaged: a gradient that differs after the gradient sync (it was not averaged across ranks).",
    )
    replica_group: list[int] = Field(
        default_factory=list, description="Ranks that hold this (shard of the) tensor and were compared."
    )
    shard_key: str | None = None
    values: list[RankValue] = Field(
        default_factory=list, description="Per-rank summaries of the disagreeing and reference ranks."
    )


class NonFinite(Model):
    """A tensor holding NaN or Inf on some rank."""

    name: str
    rank: int
    nan: int = 0
    inf: int = 0


class KeyPresence(Model):
    """A tensor name present on some ranks only."""

    name: str
    present_on: list[int]
    missing_on: list[int]


class ConsistencyReport(Model):
    """Answer of ``check_consistency`` (same on every rank), ``rankscope compare`` and ``check_tensor_consistency``."""

    consistent: bool
    causes: list[str] = Field(
        default_factory=list,
        description="What the comparison sees as the cause, most decisive first, each naming the rank: a "
        "step counter behind, a file of another run or model, keys some ranks lack, a file much older than "
        "the others'. The first leads the answer.",
    )
    world_size: int | None = None
    ranks: list[int] = Field(default_factory=list, description="Ranks whose fingerprints were compared.")
    which: str | None = None
    job_ids: list[str] = Field(default_factory=list)
    tensors: int = Field(default=0, description="Distinct tensor names seen.")
    compared: int = Field(default=0, description="Tensors compared across at least two ranks.")
    sharded_not_compared: int = Field(
        default=0, description="DTensor shards held by one rank only (nothing to compare)."
    )
    divergent: list[DivergentTensor] = Field(default_factory=list, description="In module order.")
    first_divergent: str | None = None
    nonfinite: list[NonFinite] = Field(default_factory=list)
    missing_keys: list[KeyPresence] = Field(default_factory=list)
    partial: list[str] = Field(
        default_factory=list, description="DTensors with a Partial placement (not reduced yet)."
    )
    per_rank: list[str] = Field(
        default_factory=list,
        description="Random generator states each rank holds its own value of, by design: not counted as differences.",
    )
    problems: list[str] = Field(
        default_factory=list, description="Inputs that could not be used (bad files, mixed jobs, ...)."
    )
    notes: list[str] = Field(default_factory=list)
    consistent_modules: list[str] = Field(
        default_factory=list, description="Top-level modules none of whose tensors differ, in module order."
    )
    read: list[str] = Field(
        default_factory=list,
        description="The files compared, one line per name pattern: 'rank{R}.pt: ranks 0-3'.",
    )
    summary: str = ""
    next_steps: list[NextStep] = Field(default_factory=list)
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )

    def __str__(self) -> str:
        """A short summary for ``print(report)`` inside a training script: the verdict, every divergent
        tensor grouped by module with the ranks that disagree, what is consistent and the next check,
        in at most about 1.5 KB whatever the model (the fields stay in ``model_dump``)."""
        return consistency_text(self)


TEXT_BUDGET = 1400
"""The most characters ``str(report)`` spends on the divergent tensors and the rest (about 1.5 KB in all)."""
_REASONS = {
    "not_averaged": "grads not averaged across ranks",
    "no_grad": "no grad there",
    "nonfinite": "NaN/Inf",
    "values": "values",
    "shape": "shape",
    "dtype": "dtype",
}


def _ranks_text(ranks: list[int]) -> str:
    """'rank 0', 'ranks 1-3,6': runs of consecutive ranks as ranges."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    text = ",".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)) for run in runs)
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def _module(name: str, cut: int) -> str:
    """The module a tensor is listed under: ``cut`` > 0 strips that many trailing parts (1: the module
    that owns it), ``cut`` < 0 keeps the first ``-cut`` parts (``model.layers.*``)."""
    parts = name.removesuffix(".grad").split(".")  # which="all" names a gradient "<param>.grad"
    if cut > 0:  # never above the top-level module: "(top)" for every tensor says nothing
        return ".".join(parts[: max(len(parts) - cut, min(1, len(parts) - 1))])
    return ".".join(parts[:-cut]) + (".*" if len(parts) > -cut else "")


def _groups(divergent: list[DivergentTensor], cut: int) -> list[tuple[str, list[str], str]]:
    """(module, full names, how they disagree) in module order (see ``_module`` for ``cut``)."""
    out: dict[tuple[str, str], list[str]] = {}
    for d in divergent:
        how = (
            f"{_ranks_text(d.ranks)} vs {_ranks_text(d.reference_ranks)}: {_REASONS.get(d.reason, d.reason)}"
        )
        out.setdefault((_module(d.name, cut), how), []).append(d.name)
    return [(m, names, how) for (m, how), names in out.items()]


def _group_line(module: str, names: list[str], how: str, detail: str) -> str:
    """One group: every full name, or the names below the module, or how many."""
    if detail == "count":
        return f"  {module or '(top)'} ({len(names)} tensors; {how})"
    shown = names if detail == "full" or not module else [n[len(module) + 1 :] or n for n in names]
    return f"  {module or '(top)'} ({how}): {', '.join(shown)}"


def _divergent_lines(divergent: list[DivergentTensor], budget: int) -> list[str]:
    """Every divergent tensor by module, as detailed as the budget allows: full names under the module
    that owns them (or the one above), names below it, counts per module, then per module three, two
    and one level deep, then the first groups and how many more."""
    levels: list[tuple[int, str]] = [(1, "full"), (2, "full"), (1, "leaf"), (2, "leaf"), (3, "leaf")]
    levels += [(1, "count"), (2, "count"), (-3, "count"), (-2, "count"), (-1, "count")]
    for cut, detail in levels:
        lines = [_group_line(m, names, how, detail) for m, names, how in _groups(divergent, cut)]
        if sum(len(x) + 1 for x in lines) <= budget:
            return lines
    kept: list[str] = []
    for line in lines:
        if sum(len(x) + 1 for x in kept) + len(line) > budget - 40:
            break
        kept.append(line)
    return [*kept, f"  ... {len(lines) - len(kept)} more module groups (model_dump() lists all)"]


def consistency_text(report: ConsistencyReport) -> str:
    """The text of ``str(report)``: bounded, verdict first (see ``ConsistencyReport.__str__``)."""
    head = ("CONSISTENT: " if report.consistent else "INCONSISTENT: ") + report.summary[:300]
    if report.causes:  # the cause it can see first, naming the rank
        head = f"{report.causes[0][:300]}\n{head}"
    tail: list[str] = []
    for n in report.nonfinite[:3]:
        tail.append(f"  NaN/Inf: {n.name} on rank {n.rank}")
    for k in report.missing_keys[:3]:
        tail.append(f"  only on {_ranks_text(k.present_on)}: {k.name}")
    if report.divergent or report.nonfinite or report.missing_keys:
        same = report.compared - len({d.name for d in report.divergent})
        mods = report.consistent_modules
        listed = ", ".join(mods[:6]) + (f" and {len(mods) - 6} more" if len(mods) > 6 else "")
        tail.append(
            f"consistent: {same} of {report.compared} compared tensors"
            + (f" (all of {listed})" if mods else "")
        )
    if report.next_steps:
        tail.append(f"next: {report.next_steps[0].action[:300]}")
    used = len(head) + sum(len(x) + 1 for x in tail)
    body = _divergent_lines(report.divergent, TEXT_BUDGET - used) if report.divergent else []
    return "\n".join([head, *body, *tail])
