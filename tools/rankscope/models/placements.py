"""Models of how tensors are placed across ranks: a live model's sharding, a checkpoint's chunks.

``PlacementReport`` is one rank's view of how a model is sharded
(``rankscope.probe.placement_report``); ``PlacementsReport`` is the offline answer of
``rankscope placements`` / MCP ``inspect_placements`` over a saved placement report or a
torch.distributed.checkpoint directory.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.core import Model


class TensorPlacement(Model):
    """How one parameter or buffer is laid out on this rank."""

    fqn: str
    kind: Literal["param", "buffer"] = "param"
    is_dtensor: bool = False
    layout: Literal["sharded", "replicated", "partial", "plain"] = "plain"
    mesh_shape: list[int] | None = None
    mesh_dim_names: list[str] | None = None
    placements: list[str] | None = None
    global_shape: list[int]
    local_shape: list[int]
    global_offset: list[int] | None = Field(
        default=None, description="Offset of the local shard in the global tensor."
    )
    dtype: str
    local_bytes: int
    global_bytes: int
    requires_grad: bool = False


class ModuleWrapping(Model):
    """A module wrapped by a data-parallel API."""

    fqn: str
    cls: str
    wrapping: Literal["fsdp2", "fsdp1", "ddp"]


class SizedName(Model):
    name: str
    bytes: int


class CoverageSummary(Model):
    """Where the parameter bytes are: sharded, replicated or plain; and what one rank holds."""

    param_bytes: int = Field(default=0, description="Global bytes of all parameters.")
    sharded_share: float = 0.0
    replicated_share: float = 0.0
    plain_share: float = 0.0
    largest_unsharded: list[SizedName] = Field(default_factory=list)
    fsdp_units: list[str] = Field(default_factory=list)
    modules_not_own_unit: list[SizedName] = Field(
        default_factory=list,
        description="Modules with parameters that are not their own FSDP unit: their parameters are all-gathered "
        "together with their enclosing unit.",
    )
    largest_unit: SizedName | None = Field(
        default=None, description="FSDP unit gathering the most bytes at once."
    )
    est_param_bytes_per_rank: int = 0
    est_grad_bytes_per_rank: int = 0
    est_adam_state_bytes_per_rank: int = Field(
        default=0, description="Adam: exp_avg + exp_avg_sq in fp32 (8 bytes/element)."
    )
    warnings: list[str] = Field(default_factory=list)


class PlacementReport(Model):
    """One rank's placements (``rankscope.probe.placement_report``); ``dump`` writes it as JSON."""

    format: Literal["rankscope-placements"] = "rankscope-placements"
    rank: int = 0
    world_size: int = 1
    job_id: str | None = None
    host: str | None = None
    tensors: list[TensorPlacement] = Field(default_factory=list)
    wrapping: list[ModuleWrapping] = Field(default_factory=list)
    coverage: CoverageSummary = Field(default_factory=CoverageSummary)


class Chunk(Model):
    """A piece of a tensor: offsets and sizes per dim, and where it is stored."""

    offsets: list[int]
    sizes: list[int]
    file: str | None = None
    bytes: int | None = None
    ranks: list[int] = Field(
        default_factory=list, description="Ranks holding this chunk (placement reports)."
    )


class StoredTensor(Model):
    """One tensor of a checkpoint or of a job's placement reports."""

    fqn: str
    layout: Literal["sharded", "whole"]
    global_shape: list[int]
    dtype: str | None = None
    chunks: list[Chunk] = Field(default_factory=list)
    placements: list[str] | None = None


class FileBytes(Model):
    file: str
    bytes: int


class PlacementsReport(Model):
    """Answer of ``rankscope placements`` / MCP ``inspect_placements``."""

    path: str
    source: Literal["dcp", "placement_report"]
    tensors: list[StoredTensor] = Field(default_factory=list)
    objects: list[str] = Field(
        default_factory=list, description="Non-tensor entries (bytes) of a DCP checkpoint."
    )
    files: list[FileBytes] = Field(default_factory=list)
    sharded: int = 0
    whole: int = 0
    problems: list[str] = Field(default_factory=list)
    coverage: CoverageSummary | None = None
    summary: str = ""
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )
