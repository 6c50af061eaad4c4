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
    reason: Literal["shape", "dtype", "values", "nonfinite", "no_grad"] = "values"
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
    problems: list[str] = Field(
        default_factory=list, description="Inputs that could not be used (bad files, mixed jobs, ...)."
    )
    notes: list[str] = Field(default_factory=list)
    summary: str = ""
    next_steps: list[NextStep] = Field(default_factory=list)
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )
