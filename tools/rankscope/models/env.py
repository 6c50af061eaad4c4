"""Answer of `rankscope env` / MCP `collect_env`: the node, each rank's environment, and what is wrong."""

from __future__ import annotations

from pydantic import Field

from rankscope.models.core import Backend, Finding, Job, Model


class GpuInfo(Model):
    """One GPU as nvidia-smi reports it."""

    index: int
    name: str = ""
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    driver_version: str | None = None
    ecc_uncorrected_volatile: int | None = Field(
        default=None, description="Uncorrected ECC errors since the last driver load."
    )
    ecc_uncorrected_aggregate: int | None = Field(
        default=None, description="Uncorrected ECC errors over the GPU's lifetime."
    )
    temperature_c: int | None = None
    utilization_pct: int | None = None


class GpuTopology(Model):
    """`nvidia-smi topo -m` as data: how each pair of devices is connected."""

    devices: list[str] = Field(
        default_factory=list, description="Column names: GPU0.., NIC0.. (or mlx5_0 on old drivers)."
    )
    links: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="links[a][b]: X (self), NV# (# NVLinks), PIX, PXB, PHB, NODE, SYS."
    )
    cpu_affinity: dict[str, str] = Field(default_factory=dict)
    numa_affinity: dict[str, str] = Field(default_factory=dict)
    nic_names: dict[str, str] = Field(
        default_factory=dict, description="NIC0 -> mlx5_0, from the NIC legend."
    )


class XidEvent(Model):
    """One `NVRM: Xid` line from the kernel log."""

    xid: int
    pci: str = ""
    pid: str | None = None
    process: str | None = None
    detail: str = ""
    meaning: str = ""
    line: str = ""


class ShmInfo(Model):
    path: str = "/dev/shm"
    size_bytes: int | None = None
    used_bytes: int | None = None


class Limits(Model):
    """Resource limits that matter for distributed jobs (None = unlimited)."""

    open_files_soft: int | None = None
    open_files_hard: int | None = None
    locked_memory_soft: int | None = None
    locked_memory_hard: int | None = None


class NetInterface(Model):
    name: str
    state: str | None = Field(default=None, description="operstate: up, down, unknown (loopback).")
    mtu: int | None = None
    speed_mbps: int | None = None
    addresses: list[str] = Field(default_factory=list)


class IbPort(Model):
    port: int
    state: str | None = None
    phys_state: str | None = None
    rate: str | None = None
    link_layer: str | None = None


class IbDevice(Model):
    name: str
    ports: list[IbPort] = Field(default_factory=list)


class TorchInfo(Model):
    """What `torch.utils.collect_env` and torch.distributed say, from the job's interpreter."""

    python: str = Field(description="Interpreter that was asked.")
    available: bool = False
    error: str | None = None
    version: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    cudnn: str | None = None
    backends: dict[str, bool] = Field(
        default_factory=dict, description="gloo, nccl, mpi, ucc, xccl availability."
    )
    cuda_available: bool | None = None
    gpu_count: int | None = None
    collect_env: dict[str, str] = Field(
        default_factory=dict, description="Selected torch.utils.collect_env fields."
    )


class NodeInfo(Model):
    hostname: str
    os: str | None = None
    kernel: str | None = None
    cpus: int | None = None
    cpus_usable: int | None = Field(default=None, description="CPUs in this process's affinity mask.")
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    shm: ShmInfo = Field(default_factory=ShmInfo)
    limits: Limits = Field(default_factory=Limits)
    python: str | None = None
    torch: TorchInfo | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    gpu_note: str | None = Field(
        default=None, description="Why there are no GPU facts (no driver, nvidia-smi failed)."
    )
    topology: GpuTopology | None = None
    xid_events: list[XidEvent] = Field(default_factory=list)
    xid_note: str | None = None
    interfaces: list[NetInterface] = Field(default_factory=list)
    infiniband: list[IbDevice] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class RankEnv(Model):
    """One rank's distributed environment, from /proc (redacted)."""

    rank: int | None = None
    local_rank: int | None = None
    pid: int
    host: str
    python: str | None = Field(default=None, description="/proc/PID/exe")
    torch_version: str | None = Field(
        default=None, description="From the torch package mapped into the process."
    )
    torch_path: str | None = None
    env: dict[str, str] = Field(
        default_factory=dict, description="Distributed variables (NCCL_*, TORCH_*, MASTER_*, ...)."
    )
    limits: Limits | None = None
    children: int = Field(default=0, description="Child processes (DataLoader workers, compile workers).")
    backend: Backend | None = Field(
        default=None, description="nccl | gloo | mixed | unknown, read from the process (threads, maps, fds)."
    )
    error: str | None = None


class EnvDifference(Model):
    """A variable whose value is not the same on every rank."""

    name: str
    values: dict[str, str | None] = Field(description="rank -> value (None: unset on that rank).")
    must_match: bool = True


class EnvReport(Model):
    """Answer of `rankscope env` / MCP `collect_env`."""

    node: NodeInfo
    job: Job | None = None
    ranks: list[RankEnv] = Field(
        default_factory=list, description="Live ranks, or this shell's environment without --pid."
    )
    differences: list[EnvDifference] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list, description="Most severe first.")
    errors: list[str] = Field(default_factory=list)
    left_out: list[str] = Field(
        default_factory=list,
        description="What this bounded answer left out, and the argument that brings it back.",
    )
