"""Answers about memory: per-rank live usage, CUDA snapshot analysis, budgets.

One ``MemoryReport`` answers ``rankscope memory`` / MCP ``inspect_memory``
(live job or snapshot files); ``BudgetReport`` answers ``rankscope memory
budget`` / MCP ``memory_budget``; ``MemoryProbeReport`` is what
``rankscope.probe.memory_report()`` gathers inside the job. All byte counts are
plain ints (bytes) so that agents can compare them without parsing units.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rankscope.models.core import Finding, Job, Model, NextStep, RankError

# --------------------------------------------------------------------------- live


class RankMemory(Model):
    """One rank's memory as seen from outside the process."""

    rank: int | None
    pid: int
    host: str = ""
    gpu_used_bytes: int | None = Field(
        default=None,
        description="nvidia-smi used_memory for this rank's pid (and its children); None without NVIDIA drivers.",
    )
    gpu_indices: list[str] = Field(
        default_factory=list, description="GPU uuids/indices the rank's processes appear on."
    )
    rss_bytes: int | None = Field(default=None, description="VmRSS of the rank process itself.")
    peak_rss_bytes: int | None = Field(default=None, description="VmHWM: the largest RSS the rank has had.")
    shmem_bytes: int | None = Field(
        default=None, description="RssShmem: shared memory (/dev/shm, DataLoader queues) mapped."
    )
    pss_bytes: int | None = Field(
        default=None, description="Pss from smaps_rollup: RSS with shared pages divided among sharers."
    )
    swap_bytes: int | None = None
    children: int = Field(
        default=0, description="Descendant processes (DataLoader workers, compile workers...)."
    )
    children_rss_bytes: int = 0
    children_pss_bytes: int = 0
    error: str | None = Field(
        default=None, description="Why some numbers are missing (process exited, permission)."
    )


# ---------------------------------------------------------------------- snapshots


class AllocationSite(Model):
    """Live bytes grouped by the innermost user frame that allocated them and the script line that
    led there (with that line's caller: one library line reached from two script lines is two sites)."""

    site: str = Field(description="file:line in function, or '<no frames>' when history recording was off.")
    script: str | None = Field(
        default=None,
        description="The job's own script line on the same stack (train.py:77 in main), and its caller "
        "when it is in a function (train.py:40 in evaluate <- train.py:95 in main).",
    )
    live_bytes: int
    blocks: int = Field(description="Number of live blocks (tensors) from this site.")
    stack: list[str] = Field(
        default_factory=list, description="A representative stack, innermost first (bounded)."
    )


class LeakSuspect(Model):
    """A site whose live bytes only grew across the recorded trace."""

    site: str
    script: str | None = Field(
        default=None,
        description="The job's own script line on the same stack (train.py:77 in main), and its caller "
        "when it is in a function (train.py:40 in evaluate <- train.py:95 in main).",
    )
    start_bytes: int = Field(description="Live bytes from this site at the start of the trace window.")
    end_bytes: int
    growth_bytes: int
    allocs: int
    frees: int
    windows_grown: int = Field(
        description="In how many of the trace windows its live bytes rose (never fell)."
    )
    windows: int
    kept_every: int | None = Field(
        default=None,
        description="The trace frees every allocation of this site but every Nth: N (something keeps those).",
    )
    kept: int = Field(default=0, description="Allocations of the trace at this site never freed.")


class OomEvent(Model):
    """An ``oom`` entry of the allocator trace."""

    requested_bytes: int
    device_free_bytes: int | None = Field(
        default=None, description="What the driver still reported free at that moment."
    )
    stream: int | None = None
    site: str | None = None


class Fragmentation(Model):
    """Free memory inside reserved segments, against the request that failed."""

    reserved_bytes: int
    allocated_bytes: int
    free_in_reserved_bytes: int = Field(
        description="Sum of inactive blocks in reserved segments (cached, unused)."
    )
    largest_free_block_bytes: int
    failed_request_bytes: int | None = None
    kind: Literal["fragmentation", "exhaustion", "no_oom"] = Field(
        description="fragmentation: enough cached free bytes but no block large enough; "
        "exhaustion: the request exceeds everything free; no_oom: the snapshot has no oom event."
    )
    explanation: str = ""


class SnapshotSummary(Model):
    """What one ``_dump_snapshot`` file says."""

    source: str
    rank: int | None = None
    devices: list[int] = Field(default_factory=list, description="Devices with segments or trace entries.")
    allocated_bytes: int = Field(description="Bytes in active_allocated blocks when the snapshot was taken.")
    reserved_bytes: int = Field(description="Bytes in segments (cudaMalloc'd by the caching allocator).")
    pending_free_bytes: int = 0
    peak_allocated_bytes: int = Field(
        description="Highest allocated total, replaying device_traces from the end state."
    )
    peak_reserved_bytes: int
    peak_event_index: int | None = Field(
        default=None, description="Trace entry at which the allocated peak was reached."
    )
    trace_events: int = 0
    segments: int = 0
    expandable_segments: bool | None = None
    allocator_settings: str | None = None
    ooms: list[OomEvent] = Field(default_factory=list)
    fragmentation: Fragmentation
    top_sites: list[AllocationSite] = Field(default_factory=list)
    other_sites: int = Field(default=0, description="Sites left out of top_sites.")
    other_sites_bytes: int = 0
    leak_suspects: list[LeakSuspect] = Field(default_factory=list)
    has_frames: bool = Field(
        default=True, description="False when the snapshot was recorded without stack traces."
    )
    end_time_us: int | None = Field(
        default=None, description="Time of the trace's last entry: orders snapshots of one rank."
    )


class MemoryReport(Model):
    """Answer of ``rankscope memory`` / MCP ``inspect_memory``."""

    mode: Literal["live", "snapshots"]
    job: Job | None = None
    gpu_available: bool = Field(default=False, description="Live mode: nvidia-smi answered on this host.")
    gpu_note: str | None = Field(
        default=None, description="Why GPU numbers are missing, e.g. no NVIDIA driver."
    )
    ranks: list[RankMemory] = Field(default_factory=list)
    snapshots: list[SnapshotSummary] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    next_steps: list[NextStep] = Field(default_factory=list)
    errors: list[RankError] = Field(default_factory=list)
    truncated: bool = False
    hint: str | None = None
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )


# ------------------------------------------------------------------------ budget


class ParamInfo(Model):
    """One parameter as the budget needs it (from a placement report)."""

    fqn: str
    shape: list[int] = Field(description="Global (unsharded) shape.")
    local_shape: list[int] | None = Field(
        default=None, description="Shape of this rank's shard; None when replicated."
    )
    dtype: str = "float32"
    placements: list[str] = Field(
        default_factory=list, description="e.g. ['Shard(dim=0)'] or ['Replicate()']."
    )
    unit: str | None = Field(
        default=None, description="FSDP unit (module fqn) that owns the parameter, '' for the root."
    )


class BudgetInput(Model):
    """The simple placement input rankscope accepts besides the probe's reports."""

    world_size: int | None = None
    rank: int | None = None
    fsdp: bool | None = Field(
        default=None,
        description="Whether the plan as given uses FSDP: None when the input does not say (units are then read "
        "from parameter names), False for DTensor/TP-only or DDP plans (no all-gather of parameters).",
    )
    params: list[ParamInfo]


class PlanBudget(Model):
    """Per-rank bytes for one sharding plan."""

    plan: Literal["as_given", "ddp", "fsdp_per_layer", "fsdp_root_only"]
    units: int = Field(description="FSDP units (1 for DDP: everything is replicated).")
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    allgather_peak_bytes: int = Field(description="The largest unit unsharded (params), 0 for DDP.")
    largest_unit: str | None = None
    reduce_scatter_peak_bytes: int = Field(
        default=0, description="The largest unit's unsharded gradients during backward."
    )
    total_bytes: int = Field(
        description="params + grads + optimizer + transient all-gather and reduce-scatter peaks."
    )
    fits: bool | None = Field(
        default=None, description="total_bytes <= gpu_memory; None without --gpu-memory."
    )
    headroom_bytes: int | None = Field(
        default=None, description="gpu_memory - total_bytes, left for activations."
    )


class BudgetReport(Model):
    """Answer of ``rankscope memory budget`` / MCP ``memory_budget``."""

    source: str
    world_size: int
    optimizer: str
    optimizer_states: float = Field(description="Optimizer state tensors per parameter element (adam: 2).")
    param_dtype: str
    grad_dtype: str
    optim_dtype: str
    total_params: int = Field(description="Number of parameter elements, unsharded.")
    gpu_memory_bytes: int | None = None
    plans: list[PlanBudget]
    recommended: str | None = Field(default=None, description="Plan with the most headroom that fits.")
    findings: list[Finding] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )


# ------------------------------------------------------------------------- probe


class RankMemoryStats(Model):
    """One rank's own memory counters, measured inside the process."""

    rank: int
    device: str = Field(description="'cuda:N' or 'cpu'.")
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    alloc_retries: int | None = Field(
        default=None, description="cudaMalloc retries after freeing the cache: a fragmentation sign."
    )
    num_ooms: int | None = None
    rss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    host: str = ""
    pid: int = 0


class MemoryProbeReport(Model):
    """Answer of ``rankscope.probe.memory_report()``: every rank's counters."""

    world_size: int
    gathered: bool = Field(
        description="False when called without an initialised process group (this rank only)."
    )
    ranks: list[RankMemoryStats]
    findings: list[Finding] = Field(default_factory=list)
